"""FrozenLake as a text environment: multi-turn and stochastic, on gymnasium's own dynamics."""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

from .base import TextEnv, check_effect_claims

# Text names in gymnasium's action order (LEFT=0, DOWN=1, RIGHT=2, UP=3).
ACTION_NAMES = ("Left", "Down", "Right", "Up")
SYMBOLS = {"player": "P", "frozen": "_", "hole": "O", "goal": "G", "player_in_hole": "X", "player_on_goal": "√"}
EFFECT_WORDS = ("ice", "hole", "goal", "edge")  # what move_effects can say of a move


def move_effects(rows: Sequence[str], position: int) -> tuple[str, ...]:
    """Where Left, Down, Right and Up would each lead from cell ``position`` (row-major) of a map in gymnasium's
    letters: ``"ice"`` (a frozen tile or the start), ``"hole"``, ``"goal"``, or ``"edge"`` (off the map: the player
    stays). The intended move only: on slippery ice the move made may be a perpendicular one.
    """
    size = len(rows)
    row, col = divmod(position, size)
    effects = []
    for dr, dc in ((0, -1), (1, 0), (0, 1), (-1, 0)):  # gymnasium's order: LEFT, DOWN, RIGHT, UP
        r, c = row + dr, col + dc
        if not (0 <= r < size and 0 <= c < size):
            effects.append("edge")
        else:
            effects.append({"H": "hole", "G": "goal"}.get(rows[r][c], "ice"))
    return tuple(effects)


MAX_SIZE = 16  # the largest lake side: 256 cells, still solved exactly at every reset in milliseconds


def generate_map(rng: np.random.Generator, size: int = 4, p: float = 0.8, max_tries: int = 10_000) -> list[str]:
    """Random map in gymnasium's letters (S start, F frozen, H hole, G goal) with a path from S to G.

    Unlike gymnasium's ``generate_random_map`` (start and goal fixed in opposite corners), start and goal are
    distinct random cells, as in RAGEN.

    Args:
        rng: source of randomness.
        size: side of the square map.
        p: probability that a tile is frozen.
        max_tries: maps to draw before giving up.
    """
    if size < 2 or not 0.0 < p <= 1.0:
        raise ValueError(f"FrozenLake needs size >= 2 and 0 < p <= 1; got size={size}, p={p}.")
    for _ in range(max_tries):
        board = np.where(rng.random((size, size)) < p, "F", "H")
        start, goal = (divmod(int(i), size) for i in rng.choice(size * size, size=2, replace=False))
        board[start], board[goal] = "S", "G"
        if _has_path(board, start, goal):
            return ["".join(row) for row in board]
    raise RuntimeError(f"No FrozenLake map with a path after {max_tries} draws (size={size}, p={p}); raise p.")


def _has_path(board: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    size, seen, queue = board.shape[0], {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return True
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= nr < size and 0 <= nc < size and board[nr, nc] != "H" and (nr, nc) not in seen:
                seen.add((nr, nc))
                queue.append((nr, nc))
    return False


def optimal_policy(transitions: dict, num_states: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Finite-horizon value iteration: the policy that maximises P(reach the goal within ``horizon`` moves).

    V_0(s) = 0;  V_k(s) = max_a sum_{s'} P(s'|s,a) [r(s') + (1 - done(s')) V_{k-1}(s')], r = 1 at the goal.

    Among equally good actions it takes the one that gets there soonest (the highest value discounted by 0.9
    per move): on solid ice every detour that still arrives in time ties with the shortest path, and
    demonstrations that wander are needlessly hard to imitate.

    Args:
        transitions: gymnasium's FrozenLake table ``P[s][a] = [(prob, s', reward, terminated), ...]``.
        num_states: number of cells.
        horizon: moves allowed.

    Returns:
        values (horizon + 1, num_states): success probability with k moves left;
        actions (horizon + 1, num_states): the best action with k moves left (row 0 is arbitrary).
    """
    values = np.zeros((horizon + 1, num_states))
    speed = np.zeros((horizon + 1, num_states))  # discounted value of the chosen policy, the tie-breaker
    actions = np.zeros((horizon + 1, num_states), dtype=np.int64)
    for k in range(1, horizon + 1):
        for s in range(num_states):
            q = [
                sum(p * (r + (0.0 if done else values[k - 1, s2])) for p, s2, r, done in transitions[s][a])
                for a in range(4)
            ]
            q_fast = [
                sum(p * (r + (0.0 if done else 0.9 * speed[k - 1, s2])) for p, s2, r, done in transitions[s][a])
                for a in range(4)
            ]
            best = max(q)
            chosen = max((a for a in range(4) if q[a] >= best - 1e-12), key=lambda a: q_fast[a])
            actions[k, s], values[k, s], speed[k, s] = chosen, best, q_fast[chosen]
    return values, actions


class FrozenLakeTextEnv(TextEnv):
    """Cross a frozen lake from start to goal without falling into a hole, on slippery ice.

    ## Description
    A random ``size`` x ``size`` map (each tile frozen with probability ``p``, start and goal distinct random
    cells joined by a path). Dynamics are gymnasium's ``FrozenLakeEnv``: on slippery ice the intended move
    happens with probability 1/3 and each perpendicular move with 1/3; moves into the edge stay put.

    ## Action Space
    ``Text``: one of ``Left``, ``Down``, ``Right``, ``Up`` (case-insensitive).

    ## Observation Space
    ``Text``: the map, one row per line, with ``P`` you, ``_`` frozen, ``O`` hole, ``G`` goal, ``X`` you in a
    hole, ``√`` you on the goal.

    ## Starting State
    A map generated from the reset seed (or ``options={"map": [...]}`` in gymnasium's letters ``SFHG``); the
    player on the start tile.

    ## Rewards
    1 for reaching the goal, else 0.

    ## Episode End
    Terminates in a hole or at the goal. Registered ids truncate after 100 steps.

    ## Arguments
    ``size`` (4), ``p`` (0.8): map side and frozen probability. ``is_slippery`` (True).

    ## Version History
    v0: initial release. Variant: ``FrozenLakeNotSlippery-v0``.
    """

    action_names = ACTION_NAMES
    legend = {
        SYMBOLS["player"]: "you",
        SYMBOLS["frozen"]: "frozen ice",
        SYMBOLS["hole"]: "hole",
        SYMBOLS["goal"]: "goal",
        SYMBOLS["player_in_hole"]: "you in a hole",
        SYMBOLS["player_on_goal"]: "you on the goal",
    }
    instructions = (
        "You are walking on a frozen lake. Reach the goal without falling into a hole. The ice is slippery: "
        "you may move in a direction perpendicular to the one you chose."
    )
    solid_ice_instructions = "You are walking on a frozen lake. Reach the goal without falling into a hole."

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = True, render_mode: str | None = "ansi"):
        # Checked here (validate() builds one): a huge lake's map draw and solver would run past any reset deadline.
        if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= MAX_SIZE:
            raise ValueError(f"size={size!r} must be a whole number from 2 to {MAX_SIZE}.")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"p={p!r} (the chance a cell is frozen) must lie in (0, 1].")
        if not isinstance(is_slippery, bool):
            raise ValueError(f"is_slippery={is_slippery!r} must be True or False.")
        super().__init__(render_mode=render_mode, max_observation_chars=size * (size + 1))
        self.size, self.p, self.is_slippery = size, p, is_slippery
        if not is_slippery:  # the prompt must not tell the agent about slips that never happen
            self.instructions = self.solid_ice_instructions
        self.lake: FrozenLakeEnv | None = None
        self.position = 0

    def _reset_state(self) -> None:
        desc = self.reset_options.get("map")
        if desc is None:
            desc = generate_map(self.np_random, self.size, self.p)
        elif len(desc) != self.size or any(len(row) != self.size for row in desc):
            raise ValueError(f"options['map'] must be {self.size} rows of {self.size} letters from 'SFHG'.")
        self.lake = FrozenLakeEnv(desc=desc, is_slippery=self.is_slippery)
        self.lake.np_random = self.np_random  # one generator: the reset seed fixes the map (and, by default, slips)
        self.position, _ = self.lake.reset()
        self._plan: tuple[np.ndarray, np.ndarray] | None = None

    def _apply(self, action_index: int) -> tuple[float, bool, bool]:
        before = self.position
        self.lake.np_random = self.np_random  # slips come from the episode's generator (TextEnv: TRANSITION_SEED)
        self.position, reward, terminated, _, _ = self.lake.step(action_index)
        self.position = int(self.position)
        self._success = self.lake.desc.flat[self.position] == b"G"
        return float(reward), terminated, self.position != before

    def _planned(self, moves_left: int) -> tuple[np.ndarray, np.ndarray]:
        # The map is fixed within an episode: plan once for the longest horizon asked for.
        if self._plan is None or len(self._plan[0]) <= moves_left:
            self._plan = optimal_policy(self.lake.P, self.size * self.size, max(moves_left, 1))
        return self._plan

    def optimal_action(self, moves_left: int) -> str:
        """The action maximising the chance of reaching the goal within ``moves_left`` moves."""
        moves_left = max(moves_left, 1)
        return ACTION_NAMES[self._planned(moves_left)[1][moves_left, self.position]]

    def success_probability(self, moves_left: int) -> float:
        """P(reaching the goal within ``moves_left`` moves) under the optimal policy, from the current cell."""
        return float(self._planned(moves_left)[0][moves_left, self.position])

    def reasoning_claims(self, reasoning: str) -> tuple[int, int]:
        """Checks claims "<move> <effect>" ("Down hole", "Left edge"; the words of ``move_effects``, as
        ``frozen_lake_optimal_policy(reasoning="effects")`` demonstrates them) against the player's cell now."""
        rows = [row.tobytes().decode() for row in self.lake.desc]
        return check_effect_claims(
            reasoning, dict(zip(self.action_names, move_effects(rows, self.position))), EFFECT_WORDS
        )

    def _render_text(self) -> str:
        tile_symbol = {b"S": "frozen", b"F": "frozen", b"H": "hole", b"G": "goal"}
        cells = []
        for p, tile in enumerate(self.lake.desc.flat):
            if p == self.position:
                key = {b"H": "player_in_hole", b"G": "player_on_goal"}.get(tile, "player")
            else:
                key = tile_symbol[tile]
            cells.append(SYMBOLS[key])
        return "\n".join("".join(cells[r * self.size : (r + 1) * self.size]) for r in range(self.size))
