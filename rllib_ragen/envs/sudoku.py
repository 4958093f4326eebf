"""Sudoku on a 4x4 grid (RAGEN's Sudoku environment, at the size a small model can play): fill each row, column and
2x2 box with 1-4."""

from __future__ import annotations

import itertools

import numpy as np

from .base import TextEnv

SIZE, BOX = 4, 2
# Every move as the agent writes it, "row column digit", 1-based: a closed vocabulary of 64 names.
MOVES = tuple(f"{r} {c} {d}" for r, c, d in itertools.product(range(1, SIZE + 1), repeat=3))


def solutions(grid: np.ndarray, limit: int = 2) -> list[np.ndarray]:
    """Up to ``limit`` completions of ``grid`` ((4, 4) ints, 0 for empty), by backtracking in reading order."""
    found: list[np.ndarray] = []

    def fill(grid: np.ndarray) -> None:
        empty = np.argwhere(grid == 0)
        if not len(empty):
            found.append(grid.copy())
            return
        r, c = empty[0]
        for digit in range(1, SIZE + 1):
            if fits(grid, r, c, digit):
                grid[r, c] = digit
                fill(grid)
                grid[r, c] = 0
                if len(found) >= limit:
                    return

    fill(grid.copy())
    return found


def fits(grid: np.ndarray, row: int, col: int, digit: int) -> bool:
    """Whether ``digit`` can go at (row, col), 0-based: not yet in its row, column or box."""
    r0, c0 = row - row % BOX, col - col % BOX
    return not (digit in grid[row] or digit in grid[:, col] or digit in grid[r0 : r0 + BOX, c0 : c0 + BOX])


def generate_puzzle(rng: np.random.Generator, num_empty: int) -> tuple[np.ndarray, np.ndarray]:
    """A puzzle with exactly one solution and ``num_empty`` empty cells, and that solution.

    A full grid is a fixed valid one with its digits relabelled, rows shuffled within their bands, bands shuffled,
    and the same for columns (each keeps it valid); cells are then emptied in random order, each only if the
    solution stays unique."""
    base = np.array([[(BOX * (r % BOX) + r // BOX + c) % SIZE + 1 for c in range(SIZE)] for r in range(SIZE)])
    digits = rng.permutation(SIZE) + 1
    order = lambda: [band * BOX + i for band in rng.permutation(BOX) for i in rng.permutation(BOX)]  # noqa: E731
    solution = digits[base - 1][np.ix_(order(), order())]
    puzzle = solution.copy()
    for cell in rng.permutation(SIZE * SIZE):
        if (puzzle == 0).sum() == num_empty:
            break
        kept = puzzle.flat[cell]
        puzzle.flat[cell] = 0
        if len(solutions(puzzle)) != 1:
            puzzle.flat[cell] = kept
    return puzzle, solution


class SudokuEnv(TextEnv):
    """Fill a 4x4 Sudoku so that each row, column and 2x2 box holds 1, 2, 3 and 4 once.

    ## Description
    RAGEN's Sudoku environment, at 4x4. Puzzles come from :func:`generate_puzzle`: each has exactly one solution.

    ## Action Space
    ``Text``: "row column digit", 1-based, e.g. ``"2 3 4"`` puts 4 in row 2, column 3 (64 moves, ``MOVES``).

    ## Observation Space
    ``Text``: the grid, one row per line, digits separated by spaces, ``.`` for an empty cell.

    ## Starting State
    A puzzle generated from the reset seed with ``num_empty`` empty cells.

    ## Rewards
    1 for the move that completes the grid, 0 otherwise.

    ## Episode End
    Terminates when the grid is full. A move into a filled cell, or one that repeats a digit of its row, column or
    box, is refused: it changes nothing (``action_is_effective`` False) and costs the move. A digit that fits now but
    is not the solution's can leave the grid unsolvable, since no move empties a cell: as a wrong push in Sokoban.

    ## Arguments
    ``num_empty`` (6): empty cells of a puzzle, at most 10 (RAGEN's 10-action budget solves it).

    ## Version History
    v0: initial release.
    """

    action_names = MOVES
    instructions = (
        "You are solving a 4x4 Sudoku. Fill every empty cell (.) so that each row, each column and each "
        "2x2 box contains the digits 1 to 4 exactly once. A move is the row, the column (both from 1 to "
        "4) and the digit, separated by spaces: 2 3 4 puts 4 in row 2, column 3."
    )

    def __init__(self, num_empty: int = 6, render_mode: str | None = "ansi"):
        if isinstance(num_empty, bool) or not isinstance(num_empty, int) or not 1 <= num_empty <= 10:
            raise ValueError(f"num_empty={num_empty!r} must be a whole number from 1 to 10.")
        super().__init__(render_mode=render_mode, max_observation_chars=SIZE * 2 * SIZE)
        self.num_empty = num_empty
        self.grid = np.zeros((SIZE, SIZE), dtype=int)
        self.solution = self.grid.copy()

    def lookup_action(self, text: str) -> int | None:
        """The move's index in ``MOVES``; whitespace between the three numbers does not matter."""
        return super().lookup_action(" ".join(text.split())) if isinstance(text, str) else None

    def describe(self) -> str:  # the 64 move names would drown the instructions: the syntax says it all
        return self.instructions

    def solution_moves(self) -> list[str]:
        """The moves that complete the grid from here, in reading order."""
        return [f"{r + 1} {c + 1} {self.solution[r, c]}" for r, c in np.argwhere(self.grid == 0)]

    def optimal_solution_length(self) -> int:
        return int((self.grid == 0).sum())

    def _reset_state(self) -> None:
        self.grid, self.solution = generate_puzzle(self.np_random, self.num_empty)

    def _apply(self, action_index: int) -> tuple[float, bool, bool]:
        row, col, digit = (int(n) for n in MOVES[action_index].split())
        if self.grid[row - 1, col - 1] or not fits(self.grid, row - 1, col - 1, digit):
            return 0.0, False, False
        self.grid[row - 1, col - 1] = digit
        self._success = not (self.grid == 0).any()
        return float(self._success), self._success, True

    def _render_text(self) -> str:
        return "\n".join(" ".join(str(d) if d else "." for d in row) for row in self.grid)
