"""The multi-agent games by id: ``make_game("rllib_ragen/TicTacToe-v0")``, ``make_game("textarena/KuhnPoker-v0")``.

Gymnasium's registry holds single-agent environments; RLlib takes a ``MultiAgentEnv`` class or a registered
creator, so the games have this small registry of their own.
"""

from __future__ import annotations

from typing import Any

from .kuhn_poker import KuhnPokerGame
from .multi_agent import TurnBasedTextGame
from .tic_tac_toe import TicTacToeGame

GAMES: dict[str, type[TurnBasedTextGame]] = {
    "rllib_ragen/TicTacToe-v0": TicTacToeGame,
    "rllib_ragen/KuhnPoker-v0": KuhnPokerGame,
}
TEXTARENA_PREFIX = "textarena/"


def make_game(game_id: str, **kwargs: Any) -> TurnBasedTextGame:
    """The game ``game_id`` names: a built-in one (``GAMES``) or ``"textarena/<id>"``, TextArena's two-player game
    of that id; ``kwargs`` go to its constructor."""
    if game_id.startswith(TEXTARENA_PREFIX):
        from .textarena_games import TextArenaGame  # imports textarena only when asked for

        return TextArenaGame(game_id[len(TEXTARENA_PREFIX) :], **kwargs)
    if game_id not in GAMES:
        raise ValueError(f"unknown game {game_id!r}: choose one of {sorted(GAMES)} or 'textarena/<TextArena id>'.")
    return GAMES[game_id](**kwargs)
