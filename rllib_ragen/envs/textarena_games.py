"""TextArena's two-player games (``pip install 'rllib_ragen[textarena]'``) as :class:`TurnBasedTextGame`\\ s.

``make_game("textarena/TicTacToe-v0")`` (or ``KuhnPoker-v0``, ``ConnectFour-v0``, ...): TextArena's game runs
unchanged, with the wrappers its id registers; its seats are ``"player_0"`` and ``"player_1"``, TextArena's player
ids. TextArena judges every move, as it does for its own agents, and pays at the end (``close()``): its rewards are
the seats' payoffs, so an invalid move ends the game as TextArena's rules say (a loss, in its two-player games).
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from .external import ExternalTextEnv
from .multi_agent import TurnBasedTextGame


class TextArenaGame(TurnBasedTextGame):
    """A two-player game of TextArena, by id.

    ## Action Space
    One move as the game's messages write it, with or without its square brackets (``"4"`` or ``"[4]"``); any
    non-empty text reaches TextArena, which decides whether it is legal.

    ## Observation Space
    What TextArena's observation wrapper shows the seat, from where its previous turn left off: the rules on its
    first turn, then the moves and the game's messages since.

    ## Rewards
    TextArena's, from ``close()``, when the game ends; 0 before.
    """

    possible_agents = ("player_0", "player_1")
    max_moves = 200
    # The global generators TextArena draws from are swapped per game, as for the single-player adapter.
    _package_generators = ExternalTextEnv._package_generators

    def __init__(self, game_id: str, config: Mapping[str, Any] | None = None, **game_kwargs: Any):
        super().__init__(config)
        self.game_id, self._episode_generators = game_id, None
        try:
            textarena = importlib.import_module("textarena")
        except ImportError as error:
            raise ImportError(
                f"{game_id} needs the 'textarena' package: pip install 'rllib_ragen[textarena]'"
            ) from error
        with self._package_generators():
            self.game = textarena.make(game_id, **game_kwargs)

    def _layer(self, attribute: str) -> Any:
        """The innermost wrapper (or the game) with ``attribute``: its state, its observation wrapper."""
        layer, found = self.game, None
        while layer is not None:
            if attribute in getattr(layer, "__dict__", {}):
                found = layer
            layer = getattr(layer, "__dict__", {}).get("env")
        return found

    def _reset_state(self) -> None:
        self.textarena_seed = int(self.np_random.integers(2**31))  # drawn from reset's seed: a game replays
        with self._package_generators():
            try:
                self.game.reset(num_players=2, seed=self.textarena_seed)
            except AssertionError as error:  # TextArena's states assert their player count
                raise ValueError(f"textarena/{self.game_id} is not a two-player game: {error}") from error
        self._shown = dict.fromkeys(self.agents, 0)  # characters of each seat's transcript shown so far

    def to_move(self) -> str:
        return f"player_{self._layer('state').state.current_player_id}"

    def legal_actions(self, seat: str) -> None:
        return None  # TextArena judges

    def canonical_action(self, seat: str, text: str) -> str | None:
        if not isinstance(text, str):
            return None
        move = " ".join(text.strip().removeprefix("[").removesuffix("]").split())
        return move or None

    def _play(self, seat: str, action: str) -> dict[str, float] | None:
        with self._package_generators():
            done, _ = self.game.step(f"[{action}]")
            if not done:
                return None
            rewards, self.game_info = self.game.close()
        return {f"player_{pid}": float(reward) for pid, reward in rewards.items()}

    def observe(self, seat: str) -> str:
        pid = int(seat.removeprefix("player_"))
        state = self._layer("state").state
        pending, state.observations[pid] = state.observations[pid], []
        wrapper = self._layer("full_observations")
        # The wrapper keeps each seat's whole transcript and formats it; a turn shows what is new in it.
        transcript = wrapper.observation(pid, pending) if wrapper is not None else "\n".join(m for _, m, _ in pending)
        new, self._shown[seat] = transcript[self._shown[seat] :], len(transcript)
        if self.game_over:
            new += f"\n{self.game_info[pid].get('reason', '')}"
        return new.strip()

    def describe(self, seat: str) -> str:
        return (
            f"You are {seat.replace('_', ' ').title()} in TextArena's {self.game_id.split('-')[0]}; the game's first "
            "message gives the rules. Answer one move as the game writes it."
        )
