"""Games of several seats taking turns, as text, in RLlib's ``MultiAgentEnv`` terms.

A :class:`TurnBasedTextGame` is what :class:`~rllib_ragen.envs.base.TextEnv` is for one agent: observations are
strings, actions are short strings, and it knows nothing about language models. It follows RLlib's convention for
turn-based games (``ray.rllib.examples.envs.classes.multi_agent.tic_tac_toe``): ``reset`` and ``step`` return an
observation only for the seat that moves next, and when the game ends, one for every seat, with every seat's final
reward, so each seat's trajectory closes with its own outcome. Rewards are zero-sum payoffs paid at the end.

Each seat sees its own observation (:meth:`TurnBasedTextGame.observe`): hidden cards stay hidden. A seat's
instructions (:meth:`TurnBasedTextGame.describe`) name its role, which is how one shared policy plays every seat
(self-play, SPIRAL's setting).

An action that is not one of the seat's legal moves is handled by ``illegal_move``: ``"forfeit"`` (the default, as
TextArena's games with no error allowance) ends the game, the offender losing; ``"retry"`` leaves the state as it
was and asks the same seat again, paying nothing, with ``action_is_valid=False`` in its info. The game ends
truncated after ``max_moves`` moves in all, illegal ones included, so a seat that never plays a legal move cannot
hold a retrying game open forever.

Scripted players (:class:`RandomPlayer`, the games' solvers) are callables ``player(game, seat) -> action``;
:func:`play_match` plays a game between them.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .base import ACTION_CHARSET, OBSERVATION_CHARSET

try:  # RLlib's class where Ray is there (always, beside the trainer); the environments layer imports without Ray
    from ray.rllib.env.multi_agent_env import MultiAgentEnv
except ImportError:  # the same protocol on gymnasium's base: RLlib's checker is what it lacks
    MultiAgentEnv = gym.Env

ILLEGAL_MOVE_RULES = ("forfeit", "retry")
# The outcome of a seat at the end, from its payoff's sign.
OUTCOMES = {1: "win", 0: "draw", -1: "loss"}
# A two-seat game's outcome for one seat, from the other's ("unfinished": cut short, for both).
OTHER_SEATS_OUTCOME = {"win": "loss", "loss": "win", "draw": "draw", "unfinished": "unfinished"}


class TurnBasedTextGame(MultiAgentEnv):
    """A game of ``possible_agents`` seats taking turns, with text observations and named text actions.

    Subclasses set ``possible_agents`` (the seats, in the order they are listed to a reader) and implement:

    - ``_reset_state()``: the initial state, drawing chance (a deal) from ``self.np_random``, seeded by ``reset``;
    - ``to_move() -> str``: the seat whose turn it is;
    - ``legal_actions(seat) -> list[str]``: that seat's legal moves now, canonically spelt;
    - ``_play(seat, action) -> dict[str, float] | None``: apply a legal move; every seat's payoff if the game
      ended with it, else None;
    - ``observe(seat) -> str``: what ``seat`` sees now (its own cards, not the others');
    - ``describe(seat) -> str``: the rules and ``seat``'s role, shown once before its first turn.

    ``canonical_action(seat, text)`` turns a piece of an answer into a move (case and surrounding space ignored);
    an open-ended game (TextArena's) overrides it and ``legal_actions`` returns None: the game itself judges.
    """

    possible_agents: ClassVar[Sequence[str]] = ()
    action_vocabulary: ClassVar[Sequence[str]] = ()  # every move of the game; empty: open-ended (the game judges)
    max_moves: ClassVar[int] = 64

    def __init__(self, config: Mapping[str, Any] | None = None, *, illegal_move: str = "forfeit"):
        super().__init__()
        config = dict(config or {})
        illegal_move = config.pop("illegal_move", illegal_move)
        if illegal_move not in ILLEGAL_MOVE_RULES:
            raise ValueError(f"illegal_move={illegal_move!r}: choose one of {list(ILLEGAL_MOVE_RULES)}.")
        if config:
            raise TypeError(f"{type(self).__name__} got unknown settings {sorted(config)}.")
        self.illegal_move = illegal_move
        self.agents = list(self.possible_agents)
        self.observation_spaces = {a: spaces.Text(max_length=8192, charset=OBSERVATION_CHARSET) for a in self.agents}
        self.action_spaces = {a: spaces.Text(max_length=32, charset=ACTION_CHARSET) for a in self.agents}
        self.moves = 0
        self.payoffs: dict[str, float] | None = None  # every seat's payoff once the game has ended
        self.illegal_by: str | None = None  # the seat that forfeited with an illegal move
        self.started = False

    # ---- what subclasses implement ----------------------------------------------------------------------
    def _reset_state(self) -> None:
        raise NotImplementedError

    def to_move(self) -> str:
        raise NotImplementedError

    def legal_actions(self, seat: str) -> list[str] | None:
        raise NotImplementedError

    def _play(self, seat: str, action: str) -> dict[str, float] | None:
        raise NotImplementedError

    def observe(self, seat: str) -> str:
        raise NotImplementedError

    def describe(self, seat: str) -> str:
        raise NotImplementedError

    # ---- shared -----------------------------------------------------------------------------------------
    def instructions(self, seat: str) -> str:
        """What ``seat`` reads before its first turn: its rules (``describe``) and, for a game with a move list, the
        moves, as every text environment lists its valid actions. The one text for both ways a seat is played
        (``SeatEnv`` and ``rollout.seats.play_games``), so training and validation prompts agree."""
        moves = f"\nValid actions: {', '.join(self.action_vocabulary)}." if self.action_vocabulary else ""
        return self.describe(seat) + moves

    def canonical_action(self, seat: str, text: str) -> str | None:
        """The legal move ``text`` names for ``seat`` (its canonical spelling), or None."""
        if not isinstance(text, str):
            return None
        wanted = text.strip().lower()
        return next((move for move in self.legal_actions(seat) or () if move.lower() == wanted), None)

    @property
    def game_over(self) -> bool:
        return self.payoffs is not None

    def outcome(self, seat: str) -> str:
        """``"win"``, ``"draw"`` or ``"loss"`` for ``seat`` once the game has ended (its payoff's sign)."""
        if self.payoffs is None:
            raise RuntimeError("the game has not ended")
        return OUTCOMES[int(np.sign(self.payoffs[seat]))]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.moves, self.payoffs, self.illegal_by, self.started = 0, None, None, True
        self._reset_state()
        seat = self.to_move()
        return {seat: self.observe(seat)}, {seat: {}}

    def step(self, action_dict: Mapping[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        if self.game_over or not self.started:
            raise RuntimeError("step() before reset() or after the game ended: call reset()")
        seat = self.to_move()
        if set(action_dict) != {seat}:
            raise ValueError(f"it is {seat!r}'s turn; got actions for {sorted(action_dict)}.")
        self.moves += 1
        move = self.canonical_action(seat, action_dict[seat])
        valid = move is not None
        if valid:
            payoffs = self._play(seat, move)
        elif self.illegal_move == "forfeit":
            self.illegal_by = seat
            payoffs = self.forfeit_payoffs(seat)
        else:
            payoffs = None
        truncated = payoffs is None and self.moves >= self.max_moves
        if payoffs is None and not truncated:
            nxt = self.to_move()
            info = {"action_is_valid": valid} if nxt == seat else {}
            return ({nxt: self.observe(nxt)}, {}, {"__all__": False}, {"__all__": False}, {nxt: info})
        # The game is over: every seat gets its last view and its payoff (0 each when truncated).
        self.payoffs = dict(payoffs) if payoffs is not None else dict.fromkeys(self.agents, 0.0)
        infos = {
            a: {"success": self.payoffs[a] > 0, "outcome": self.outcome(a), "illegal_move": self.illegal_by == a}
            for a in self.agents
        }
        infos[seat]["action_is_valid"] = valid
        observations = {a: self.observe(a) for a in self.agents}
        return (
            observations,
            {a: float(self.payoffs[a]) for a in self.agents},
            {"__all__": payoffs is not None},
            {"__all__": truncated},
            infos,
        )

    def forfeit_note(self, seat: str) -> str | None:
        """What ``seat`` reads about a forfeit that ended the game, if one did."""
        if self.illegal_by is None:
            return None
        return f"{'You' if self.illegal_by == seat else 'Your opponent'} made an illegal move and forfeit the game."

    def forfeit_payoffs(self, offender: str) -> dict[str, float]:
        """The payoffs when ``offender`` forfeits: it loses 1, the others share its loss."""
        others = [a for a in self.agents if a != offender]
        return {a: (-1.0 if a == offender else 1.0 / len(others)) for a in self.agents}


Player = Callable[[TurnBasedTextGame, str], str]


class RandomPlayer:
    """Plays a uniformly random legal move, drawn from its own generator (seeded, so a match replays)."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def __call__(self, game: TurnBasedTextGame, seat: str) -> str:
        moves = game.legal_actions(seat)
        if not moves:
            raise ValueError(f"{type(game).__name__} lists no legal moves for {seat!r}: a random player needs them.")
        return moves[int(self.rng.integers(len(moves)))]


def play_match(game: TurnBasedTextGame, players: Mapping[str, Player], seed: int | None = None) -> dict[str, float]:
    """Play one game between scripted ``players`` (one per seat) from ``reset(seed=seed)``; every seat's payoff."""
    observations, _ = game.reset(seed=seed)
    while True:
        (seat,) = observations
        observations, rewards, terminated, truncated, _ = game.step({seat: players[seat](game, seat)})
        if terminated["__all__"] or truncated["__all__"]:
            return rewards
