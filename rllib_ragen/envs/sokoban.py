"""Sokoban as a text environment: multi-turn, deterministic, and irreversible."""

from __future__ import annotations

from typing import Mapping

from .base import TextEnv, check_effect_claims
from .sokoban_levels import (
    ACTION_NAMES,
    EFFECT_WORDS,
    SYMBOL_SETS,
    SokobanLevel,
    generate_level,
    move_effects,
    move_offsets,
    solve_level,
)

_MEANINGS = {
    "wall": "wall",
    "floor": "empty floor",
    "target": "target",
    "box": "box",
    "box_on_target": "box on target",
    "player": "you",
    "player_on_target": "you on a target",
}

STEP_PENALTY = -0.1
BOX_ON_TARGET_REWARD = 1.0
SOLVED_BONUS = 10.0
REWARDS = ("shaped", "success")
RENDERINGS = ("grid", "coordinates")


MAX_DIM = 20  # the largest room: a level is drawn by search, and its text grows with dim squared
MAX_LEVEL_DRAWS = 1000  # levels drawn for one reset before max_solution_moves is judged too low for the room


class SokobanEnv(TextEnv):
    """Push every box onto a target in a small walled room.

    ## Description
    Levels come from :func:`~rllib_ragen.envs.sokoban_levels.generate_level`: a random room, boxes placed on
    targets, then pulled away by reverse play, so every level is solvable. Boxes can be pushed but never
    pulled, so a wrong push can make a level unsolvable: the environment is irreversible.

    ## Action Space
    ``Text``: one of ``Up``, ``Down``, ``Left``, ``Right`` (case-insensitive).

    ## Observation Space
    ``Text``: the room, one row per line, e.g. ``#####\\n#P_X_O#\\n...``; symbols are listed in ``legend``.

    ## Starting State
    A level generated from the reset seed (or the level passed as ``options={"level": SokobanLevel}``).

    ## Rewards
    ``reward="shaped"`` (RAGEN's): -0.1 per valid move (walking into a wall included), +1 for each box
    pushed onto a target, -1 for each box pushed off one, +10 when all boxes are on targets.
    ``reward="success"``: 1 for the move that solves the level, 0 otherwise. With a small model and few groups
    the shaped terms mostly add noise to the advantages; the solved/not-solved signal is what RL should raise.
    An unknown action pays 0 in both.
    ``distance_shaping=w`` (off at 0) adds potential-based shaping (Ng, Harada and Russell, 1999) to either:
    ``w * (phi(after) - phi(before))`` per move, where ``-phi`` is the boxes' Manhattan distances to their nearest
    targets plus the player's distance to the nearest box off a target (0 when solved). A push towards a target or
    a step towards a box pays ``+w``, one away ``-w``. An episode's shaping adds up to ``w * (phi(end) -
    phi(start))``: a solved level always earns ``w`` times its start distance, whatever the path, and a failed one
    is paid for how close it ended. With ``gamma=1`` it leaves the best policy unchanged; in a group of the same
    level the start term is shared, so it tells apart episodes that all failed, which the solved/not-solved
    reward cannot.

    ## Episode End
    Terminates when every box is on a target. Registered ids truncate after 100 steps.

    ## Arguments
    ``dim`` (6): room side, walls included. ``num_boxes`` (1). ``search_depth`` (50): reverse-play steps, more
    gives longer solutions. ``symbols`` ("default" or "alternate", or a dict with the keys of
    ``SYMBOL_SETS["default"]``). ``reward`` ("shaped" or "success", see Rewards). ``render`` ("grid", or
    "coordinates": the cells as zero-indexed (row, column) lists, RAGEN's CoordSokoban,
    :meth:`~rllib_ragen.envs.sokoban_levels.SokobanLevel.to_coordinates`). ``distance_shaping`` (0.0: off; see
    Rewards). ``max_solution_moves`` (None: off): easy levels only. A drawn level whose fewest-moves solution is
    longer is drawn again from the same seeded generator, so a seed still fixes the level, and a seed whose first
    draw is short enough gives the same level as without the bound. A curriculum (``StarPOConfig.environment(
    curriculum=...)``) raises it over training.

    ## Version History
    v0: initial release. Variants: ``Sokoban8x8TwoBoxes-v0``, ``SokobanAltSymbols-v0`` and
    ``SokobanCoordinates-v0``.
    """

    action_names = ACTION_NAMES
    instructions = (
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes onto targets. "
        "When you are right next to a box, you can push it by moving in the same direction. You cannot push a "
        "box through a wall, and you cannot pull a box."
    )

    def __init__(
        self,
        dim: int = 6,
        num_boxes: int = 1,
        search_depth: int = 50,
        symbols: str | Mapping[str, str] = "default",
        reward: str = "shaped",
        render: str = "grid",
        distance_shaping: float = 0.0,
        max_solution_moves: int | None = None,
        render_mode: str | None = "ansi",
    ):
        for name, value, low, high in (
            ("dim", dim, 4, MAX_DIM),
            ("num_boxes", num_boxes, 1, MAX_DIM),
            ("search_depth", search_depth, 1, 10_000),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name}={value!r} must be a whole number from {low} to {high}.")
        if reward not in REWARDS:
            raise ValueError(f"reward={reward!r}: choose one of {REWARDS}.")
        if render not in RENDERINGS:
            raise ValueError(f"render={render!r}: choose one of {RENDERINGS}.")
        if (
            isinstance(distance_shaping, bool)
            or not isinstance(distance_shaping, (int, float))
            or not 0 <= distance_shaping < float("inf")
        ):  # NaN fails too
            raise ValueError(f"distance_shaping={distance_shaping!r} must be a finite number >= 0 (0: off).")
        if max_solution_moves is not None and (
            isinstance(max_solution_moves, bool) or not isinstance(max_solution_moves, int) or max_solution_moves < 1
        ):
            raise ValueError(f"max_solution_moves={max_solution_moves!r} must be a whole number >= 1 (None: off).")
        self.max_solution_moves = max_solution_moves
        self.reward, self.render_as, self.distance_shaping = reward, render, float(distance_shaping)
        if isinstance(symbols, str):
            if symbols not in SYMBOL_SETS:
                raise ValueError(f"symbols={symbols!r}: choose one of {sorted(SYMBOL_SETS)} or pass a dict.")
            symbols = SYMBOL_SETS[symbols]
        if set(symbols) != set(_MEANINGS) or len(set(symbols.values())) != len(_MEANINGS):
            raise ValueError(f"symbols must map each of {sorted(_MEANINGS)} to a distinct character.")
        self.symbols = dict(symbols)
        # Coordinates name no symbols: a legend would only describe a drawing the agent never sees.
        drawn = {self.symbols[key]: meaning for key, meaning in _MEANINGS.items()}
        self.legend = {} if render == "coordinates" else drawn
        # A coordinate list names each cell in at most 8 characters, plus the five lines' labels.
        max_chars = dim * (dim + 1) if render == "grid" else 8 * dim * dim + 120
        super().__init__(render_mode=render_mode, max_observation_chars=max_chars)
        self.dim, self.num_boxes, self.search_depth = dim, num_boxes, search_depth
        self._offsets = move_offsets(dim)
        self.level: SokobanLevel | None = None
        self.boxes: set[int] = set()
        self.player = 0

    def _reset_state(self) -> None:
        level = self.reset_options.get("level")
        if level is None:
            level = self._draw_level()
        elif level.dim != self.dim:
            raise ValueError(f"options['level'] is {level.dim}x{level.dim} but this env was made with dim={self.dim}.")
        self.level, self.boxes, self.player = level, set(level.boxes), level.player

    def _draw_level(self) -> SokobanLevel:
        """A level from the seeded generator; with ``max_solution_moves``, the first one solved in that many moves."""
        for _ in range(MAX_LEVEL_DRAWS):
            level = generate_level(self.np_random, self.dim, self.num_boxes, self.search_depth)
            if self.max_solution_moves is None:
                return level
            solution = solve_level(level)
            if solution is not None and len(solution) <= self.max_solution_moves:
                return level
        raise RuntimeError(
            f"no level of {MAX_LEVEL_DRAWS} drawn (dim={self.dim}, num_boxes={self.num_boxes}, "
            f"search_depth={self.search_depth}) is solved in max_solution_moves="
            f"{self.max_solution_moves} moves: raise it, or lower num_boxes."
        )

    def _current_level(self) -> SokobanLevel:
        """The level as it stands now (boxes and player moved)."""
        return SokobanLevel(self.dim, self.level.floor, self.level.targets, frozenset(self.boxes), self.player)

    def optimal_solution_length(self) -> int | None:
        """Moves of the fewest-moves solution from the current position (the solver's BFS); None if unsolvable."""
        solution = solve_level(self._current_level())
        return None if solution is None else len(solution)

    def reasoning_claims(self, reasoning: str) -> tuple[int, int]:
        """Checks claims of the form "<move> <effect>" ("Up wall", "Left push to target"; the words of
        ``move_effects``, as ``sokoban_solver_policy(reasoning="effects")`` demonstrates them) against the board
        now: one claim per move named, the first wins."""
        truth = dict(zip(self.action_names, move_effects(self._current_level())))
        return check_effect_claims(reasoning, truth, EFFECT_WORDS)

    def _apply(self, action_index: int) -> tuple[float, bool, bool]:
        before = self.distance_potential() if self.distance_shaping else 0.0
        shaped, effective = self._move(action_index)
        self._success = self.boxes == self.level.targets
        reward = float(self._success) if self.reward == "success" else shaped + SOLVED_BONUS * self._success
        if self.distance_shaping:
            reward += self.distance_shaping * (self.distance_potential() - before)
        return reward, self._success, effective

    def distance_potential(self) -> float:
        """The shaping potential now: minus the boxes' Manhattan distances to their nearest targets and the
        player's to the nearest box off a target (0 when solved)."""

        def cells_apart(a: int, b: int) -> int:
            (ar, ac), (br, bc) = divmod(a, self.dim), divmod(b, self.dim)
            return abs(ar - br) + abs(ac - bc)

        off_target = self.boxes - self.level.targets
        boxes = sum(min(cells_apart(box, t) for t in self.level.targets) for box in off_target)
        player = min((cells_apart(self.player, box) for box in off_target), default=0)
        return -float(boxes + player)

    def _move(self, action_index: int) -> tuple[float, bool]:
        """Walk or push one step; returns the shaped reward (without the solved bonus) and whether it moved."""
        d, floor, targets = self._offsets[action_index], self.level.floor.ravel(), self.level.targets
        reward, nxt = STEP_PENALTY, self.player + d
        if not floor[nxt]:
            return reward, False
        if nxt in self.boxes:
            dest = nxt + d
            if not floor[dest] or dest in self.boxes:
                return reward, False
            self.boxes.remove(nxt)
            self.boxes.add(dest)
            reward += BOX_ON_TARGET_REWARD * ((dest in targets) - (nxt in targets))
        self.player = nxt
        return reward, True

    def _render_text(self) -> str:
        if self.render_as == "coordinates":
            return self._current_level().to_coordinates()
        s, floor, targets = self.symbols, self.level.floor.ravel(), self.level.targets
        cells = []
        for p in range(self.dim * self.dim):
            on_target = p in targets
            if not floor[p]:
                key = "wall"
            elif p == self.player:
                key = "player_on_target" if on_target else "player"
            elif p in self.boxes:
                key = "box_on_target" if on_target else "box"
            else:
                key = "target" if on_target else "floor"
            cells.append(s[key])
        return "\n".join("".join(cells[r * self.dim : (r + 1) * self.dim]) for r in range(self.dim))
