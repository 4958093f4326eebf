"""Tic-tac-toe for two seats, with its exact minimax solution: the smallest game whose optimum is known.

Perfect play by both seats draws, so against :class:`MinimaxPlayer` a player's best result is a draw: its draw rate
there says how close to perfect it plays.
"""

from __future__ import annotations

import functools

import numpy as np

from .multi_agent import TurnBasedTextGame

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
MARKS = {"x": "X", "o": "O"}


def winner(board: tuple[str, ...]) -> str | None:
    """The mark ("X" or "O") with three in a line on ``board`` (9 cells, "" empty), or None."""
    for a, b, c in LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return None


@functools.lru_cache(maxsize=None)
def minimax_value(board: tuple[str, ...], mark: str) -> int:
    """The game's value for ``mark``, to move on ``board``, under perfect play: 1 win, 0 draw, -1 loss."""
    if winner(board):  # the previous move won
        return -1
    free = [i for i, cell in enumerate(board) if not cell]
    if not free:
        return 0
    other = "O" if mark == "X" else "X"
    return max(-minimax_value(board[:i] + (mark,) + board[i + 1 :], other) for i in free)


def best_cells(board: tuple[str, ...], mark: str) -> list[int]:
    """Every free cell (0-8) whose move keeps ``mark``'s minimax value."""
    free = [i for i, cell in enumerate(board) if not cell]
    other = "O" if mark == "X" else "X"
    values = {i: -minimax_value(board[:i] + (mark,) + board[i + 1 :], other) for i in free}
    best = max(values.values())
    return [i for i in free if values[i] == best]


class TicTacToeGame(TurnBasedTextGame):
    """Tic-tac-toe: seat ``"x"`` moves first, then ``"o"``; three marks in a row, column or diagonal win.

    ## Action Space
    A cell's number, ``"1"`` to ``"9"``, row by row from the top left; a cell already taken is illegal.

    ## Observation Space
    The board, free cells shown by their numbers, the seat's mark and the opponent's last move.

    ## Rewards
    1 to the winner and -1 to the loser when the game ends, 0 each for a draw.
    """

    possible_agents = ("x", "o")
    action_vocabulary = tuple("123456789")
    max_moves = 32

    def _reset_state(self) -> None:
        self.board: tuple[str, ...] = ("",) * 9
        self.last_move: tuple[str, int] | None = None

    def to_move(self) -> str:
        return "x" if self.board.count("X") == self.board.count("O") else "o"

    def legal_actions(self, seat: str) -> list[str]:
        return [str(i + 1) for i, cell in enumerate(self.board) if not cell] if not self.game_over else []

    def _play(self, seat: str, action: str) -> dict[str, float] | None:
        cell = int(action) - 1
        self.board = self.board[:cell] + (MARKS[seat],) + self.board[cell + 1 :]
        self.last_move = (seat, cell)
        if winner(self.board):
            return {a: (1.0 if a == seat else -1.0) for a in self.agents}
        return None if "" in self.board else dict.fromkeys(self.agents, 0.0)

    def render_board(self) -> str:
        cells = [cell or str(i + 1) for i, cell in enumerate(self.board)]
        rows = [" " + " | ".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
        return "\n---+---+---\n".join(rows)

    def observe(self, seat: str) -> str:
        lines = []
        if self.last_move is not None:
            who, cell = self.last_move
            lines.append(f"{'You' if who == seat else 'Your opponent'} played {cell + 1}.")
        lines.append(self.render_board())
        if self.game_over:
            lines.append({"win": "You won.", "loss": "You lost.", "draw": "A draw."}[self.outcome(seat)])
            if self.illegal_by is not None:
                lines.append(self.forfeit_note(seat))
        else:
            lines.append(f"You play {MARKS[seat]}. Free cells: {', '.join(self.legal_actions(seat))}.")
        return "\n".join(lines)

    def describe(self, seat: str) -> str:
        first = "You move first." if seat == "x" else "Your opponent moves first."
        return (
            f"Tic-tac-toe on a 3x3 board. You play {MARKS[seat]}, your opponent {MARKS['o' if seat == 'x' else 'x']}. "
            f"{first} Three of your marks in a row, column or diagonal win. On your turn, answer the number of a "
            "free cell (1-9, row by row from the top left)."
        )


class MinimaxPlayer:
    """Perfect tic-tac-toe: a move of best minimax value, drawn uniformly among them from its own generator."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def __call__(self, game: TicTacToeGame, seat: str) -> str:
        cells = best_cells(game.board, MARKS[seat])
        return str(cells[int(self.rng.integers(len(cells)))] + 1)
