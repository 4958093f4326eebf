"""Sokoban levels: a seeded reverse-play generator and an optimal (fewest-moves) solver.

Cells are flat indices ``row * dim + col``. Every generated room has a wall border, so a move never wraps
around a row edge. Reverse play starts from the solved state and only makes moves whose forward counterpart
is legal (pulling a box is the reverse of pushing it, walking is its own reverse), so every level it returns
is solvable; :func:`solve_level` proves it in the tests for thousands of levels.
"""

from __future__ import annotations

import re

from collections import deque
from dataclasses import dataclass

import numpy as np

# Action order shared by the env and the solver: Up, Down, Left, Right.
ACTION_NAMES = ("Up", "Down", "Left", "Right")

# The symbol sets levels are drawn with. "default" is RAGEN's; "alternate" draws the same levels with
# other symbols, to test whether a policy learned the game or the glyphs.
SYMBOL_SETS: dict[str, dict[str, str]] = {
    "default": {
        "wall": "#",
        "floor": "_",
        "target": "O",
        "box": "X",
        "box_on_target": "√",
        "player": "P",
        "player_on_target": "S",
    },
    "alternate": {
        "wall": "+",
        "floor": ".",
        "target": "*",
        "box": "B",
        "box_on_target": "$",
        "player": "@",
        "player_on_target": "&",
    },
}


def move_offsets(dim: int) -> tuple[int, int, int, int]:
    """Flat-index offsets of Up, Down, Left, Right in a room of side ``dim``."""
    return (-dim, dim, -1, 1)


@dataclass(frozen=True)
class SokobanLevel:
    """An immutable Sokoban position.

    Attributes:
        dim: side length of the square room (walls included).
        floor: bool array (dim, dim); False marks a wall.
        targets: flat indices of the target cells.
        boxes: flat indices of the boxes (as many as targets).
        player: flat index of the player.
    """

    dim: int
    floor: np.ndarray
    targets: frozenset[int]
    boxes: frozenset[int]
    player: int

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    @classmethod
    def from_text(cls, text: str, symbols: dict[str, str] | None = None) -> "SokobanLevel":
        """Parse a level drawn with ``symbols`` (default: ``SYMBOL_SETS["default"]``: ``#`` wall, ``_`` floor,
        ``O`` target, ``X`` box, ``√`` box on target, ``P`` player, ``S`` player on target), one row per line, or
        written as coordinates (:meth:`to_coordinates`)."""
        if text.lstrip().startswith(_BOARD_SIZE):
            return cls._from_coordinates(text)
        meaning = {ch: key for key, ch in (symbols or SYMBOL_SETS["default"]).items()}
        rows = [row.strip() for row in text.strip().splitlines()]
        dim = len(rows)
        if any(len(row) != dim for row in rows):
            raise ValueError(f"A Sokoban level must be square; got row lengths {[len(r) for r in rows]}.")
        floor = np.zeros((dim, dim), dtype=bool)
        targets, boxes, players = set(), set(), []
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                p, key = r * dim + c, meaning.get(ch)
                if key is None:
                    raise ValueError(f"Unknown Sokoban symbol {ch!r} at row {r}, column {c}.")
                floor[r, c] = key != "wall"
                if key in ("target", "box_on_target", "player_on_target"):
                    targets.add(p)
                if key in ("box", "box_on_target"):
                    boxes.add(p)
                if key in ("player", "player_on_target"):
                    players.append(p)
        if len(players) != 1 or len(boxes) != len(targets) or not boxes:
            raise ValueError("A level needs one player and as many boxes as targets (at least one).")
        # Moves are flat-index offsets; a wall border keeps them from wrapping across rows.
        if floor[0].any() or floor[-1].any() or floor[:, 0].any() or floor[:, -1].any():
            raise ValueError("A Sokoban level must be enclosed by a border of walls.")
        return cls(dim, floor, frozenset(targets), frozenset(boxes), players[0])

    def to_coordinates(self) -> str:
        """The level as lists of zero-indexed (row, column) cells, RAGEN's ``CoordSokoban`` rendering, plus the
        walls inside the border (which RAGEN's leaves out, though no plan can be made without them)::

            Board size: 6 rows x 6 cols (zero-indexed).
            Walls: the border, and (2, 3)
            Targets: (1, 4)
            Boxes: (2, 2)
            Player: (3, 1)

        Boxes on a target are listed as "Boxes on target", a player on one as "Player on target"."""
        cell = lambda p: f"({p // self.dim}, {p % self.dim})"  # noqa: E731
        inner = [
            p
            for p in range(self.dim * self.dim)
            if not self.floor.flat[p] and 0 < p // self.dim < self.dim - 1 and 0 < p % self.dim < self.dim - 1
        ]
        groups = [
            ("Targets", sorted(self.targets - self.boxes)),
            ("Boxes", sorted(self.boxes - self.targets)),
            ("Boxes on target", sorted(self.boxes & self.targets)),
            ("Player on target" if self.player in self.targets else "Player", [self.player]),
        ]
        lines = [
            f"{_BOARD_SIZE} {self.dim} rows x {self.dim} cols (zero-indexed).",
            "Walls: the border" + (", and " + ", ".join(map(cell, inner)) if inner else ""),
        ]
        lines += [f"{label}: {', '.join(map(cell, cells))}" for label, cells in groups if cells]
        return "\n".join(lines)

    @classmethod
    def _from_coordinates(cls, text: str) -> "SokobanLevel":
        dim = int(re.search(rf"{_BOARD_SIZE} (\d+) rows", text).group(1))
        cells = {
            label: {int(r) * dim + int(c) for r, c in re.findall(r"\((\d+), (\d+)\)", rest)}
            for label, rest in re.findall(r"^([A-Za-z ]+): (.*)$", text, re.MULTILINE)
        }
        floor = np.ones((dim, dim), dtype=bool)
        floor[0, :] = floor[-1, :] = floor[:, 0] = floor[:, -1] = False
        floor.flat[sorted(cells.get("Walls", ()))] = False
        on_target = cells.get("Boxes on target", set())
        player = cells.get("Player", set()) | cells.get("Player on target", set())
        targets = cells.get("Targets", set()) | on_target | cells.get("Player on target", set())
        return cls(dim, floor, frozenset(targets), frozenset(cells.get("Boxes", set()) | on_target), player.pop())


_BOARD_SIZE = "Board size:"
EFFECT_WORDS = ("walk", "push", "push to target", "wall")  # what move_effects can say of a move


def move_effects(level: SokobanLevel) -> tuple[str, str, str, str]:
    """What Up, Down, Left and Right would each do from ``level``: one of four words each.

    ``"walk"``: onto free floor or a target; ``"push"``: moves a box; ``"push to target"``: moves a box onto a
    target; ``"wall"``: the player stays, against a wall or a box with a wall or another box behind it.
    """
    flat, effects = level.floor.ravel(), []
    for d in move_offsets(level.dim):
        ahead, beyond = level.player + d, level.player + 2 * d
        if not flat[ahead]:
            effects.append("wall")
        elif ahead not in level.boxes:
            effects.append("walk")
        elif not flat[beyond] or beyond in level.boxes:  # the wall border keeps ``beyond`` inside the room
            effects.append("wall")
        else:
            effects.append("push to target" if beyond in level.targets else "push")
    return tuple(effects)


# ---- generation -------------------------------------------------------------------------------------------
def _carve_room(rng: np.random.Generator, dim: int) -> np.ndarray:
    """Random room topology: a random walk inside the border that carves 1- to 3-cell patches of floor."""
    floor = np.zeros((dim, dim), dtype=bool)
    patches = ([(0, 0)], [(0, 0), (0, 1)], [(0, 0), (1, 0)], [(0, 0), (0, 1), (1, 0)])
    moves = ((-1, 0), (1, 0), (0, -1), (0, 1))
    r, c = (int(x) for x in rng.integers(1, dim - 1, size=2))
    direction = moves[int(rng.integers(4))]
    for _ in range(int(1.7 * 2 * dim)):
        if rng.random() < 0.35:
            direction = moves[int(rng.integers(4))]
        r = min(max(r + direction[0], 1), dim - 2)
        c = min(max(c + direction[1], 1), dim - 2)
        for dr, dc in patches[int(rng.integers(len(patches)))]:
            floor[min(r + dr, dim - 2), min(c + dc, dim - 2)] = True
    return floor


def _reverse_play(
    rng: np.random.Generator, level: SokobanLevel, search_depth: int, pull_prob: float = 0.8
) -> SokobanLevel | None:
    """Random reverse play from the solved ``level``; returns the hardest-looking state it visited.

    A state is a candidate only when no box sits on a target. Candidates are scored by pulls made so far times
    total box displacement (each box's distance to its nearest target); the best wins, later states breaking
    ties. Counting pulls, not only distance, favours levels that need several pushes.
    """
    offsets = move_offsets(level.dim)
    flat_floor = level.floor.ravel()
    boxes, player = set(level.boxes), level.player
    target_rc = [divmod(t, level.dim) for t in level.targets]
    best, best_score, pulls = None, -1, 0
    for _ in range(search_depth):
        d = offsets[int(rng.integers(4))]
        nxt, behind = player + d, player - d
        if not flat_floor[nxt] or nxt in boxes:
            continue
        if behind in boxes and rng.random() < pull_prob:
            boxes.remove(behind)
            boxes.add(player)
            pulls += 1
        player = nxt
        if boxes.isdisjoint(level.targets):
            score = pulls * sum(
                min(abs(br - tr) + abs(bc - tc) for tr, tc in target_rc)
                for br, bc in (divmod(b, level.dim) for b in boxes)
            )
            if score >= best_score:
                best, best_score = (frozenset(boxes), player), score
    if best is None:
        return None
    boxes_out, player = best
    # Move the player a few steps away from the last box it pulled; walking is its own reverse.
    for _ in range(int(rng.integers(2, 8))):
        d = offsets[int(rng.integers(4))]
        if flat_floor[player + d] and player + d not in boxes_out:
            player += d
    return SokobanLevel(level.dim, level.floor, level.targets, boxes_out, player)


def generate_level(
    rng: np.random.Generator, dim: int = 6, num_boxes: int = 1, search_depth: int = 50, max_tries: int = 1000
) -> SokobanLevel:
    """Generate a solvable level by reverse play from a solved room.

    Args:
        rng: the only source of randomness (an env passes ``self.np_random``), so a seed fixes the level.
        dim: side of the square room, walls included (>= 4).
        num_boxes: boxes (and targets) in the room.
        search_depth: reverse-play steps; more steps give longer solutions.
        max_tries: rooms to try before giving up (a room may be too small for the boxes).

    Returns:
        A level with every box off its target.
    """
    if dim < 4:
        raise ValueError(f"dim={dim}: a Sokoban room needs dim >= 4 (a wall border around 2x2 floor).")
    if num_boxes < 1:
        raise ValueError(f"num_boxes={num_boxes} must be at least 1.")
    for _ in range(max_tries):
        floor = _carve_room(rng, dim)
        cells = np.flatnonzero(floor.ravel())
        if len(cells) < num_boxes + 3:
            continue
        chosen = rng.choice(cells, size=num_boxes + 1, replace=False)
        targets = frozenset(int(p) for p in chosen[:-1])
        solved = SokobanLevel(dim, floor, targets, targets, int(chosen[-1]))
        level = _reverse_play(rng, solved, search_depth)
        if level is not None:
            return level
    raise RuntimeError(
        f"No solvable level after {max_tries} rooms for dim={dim}, num_boxes={num_boxes}; "
        "raise dim or search_depth, or lower num_boxes."
    )


# ---- solving ----------------------------------------------------------------------------------------------
def _live_cells(level: SokobanLevel) -> set[int]:
    """Cells from which a box can still reach some target (ignoring other boxes).

    Found by pulling a box backwards from every target: a box can be pushed from a to a+d only if the player
    can stand at a-d, so the reverse step from b=a+d to a needs floor at a and at a-d.
    """
    offsets, flat = move_offsets(level.dim), level.floor.ravel()
    live, frontier = set(level.targets), list(level.targets)
    while frontier:
        b = frontier.pop()
        for d in offsets:
            a = b - d
            if flat[a] and flat[a - d] and a not in live:
                live.add(a)
                frontier.append(a)
    return live


def solve_level(level: SokobanLevel, max_states: int = 2_000_000) -> list[str] | None:
    """Shortest action sequence (fewest moves, pushes and walks alike) that solves ``level``.

    Breadth-first search over (player, boxes) states; boxes pushed onto cells from which no target is
    reachable are pruned, which never removes a solution.

    Returns:
        The action names (``"Up"``, ...) of an optimal solution, ``[]`` if already solved, or None when the level
        has no solution within ``max_states`` explored states.
    """
    if level.solved:
        return []
    offsets, flat = move_offsets(level.dim), level.floor.ravel()
    live = _live_cells(level)
    start = (level.player, level.boxes)
    parents: dict[tuple[int, frozenset[int]], tuple[tuple[int, frozenset[int]], int] | None] = {start: None}
    queue = deque([start])
    while queue and len(parents) < max_states:
        state = queue.popleft()
        player, boxes = state
        for action, d in enumerate(offsets):
            nxt = player + d
            if not flat[nxt]:
                continue
            if nxt in boxes:
                dest = nxt + d
                if not flat[dest] or dest in boxes or dest not in live:
                    continue
                new_boxes = (boxes - {nxt}) | {dest}
            else:
                new_boxes = boxes
            child = (nxt, new_boxes)
            if child in parents:
                continue
            parents[child] = (state, action)
            if new_boxes == level.targets:
                return _backtrack(parents, child)
            queue.append(child)
    return None


def _backtrack(parents: dict, state) -> list[str]:
    actions = []
    while parents[state] is not None:
        state, action = parents[state]
        actions.append(ACTION_NAMES[action])
    return actions[::-1]
