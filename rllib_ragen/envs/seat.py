"""One seat of a multi-agent game as a single-agent text environment, the other seats played by scripted opponents.

``make_text_env("rllib_ragen/TicTacToe-v0", opponent="minimax")`` is a :class:`TextEnv` like any other: every
trainer, validation and evaluation path of the package plays it unchanged. It is how a policy is trained against a
fixed opponent (SPIRAL's baseline, which it reports overfits to that opponent) and how a self-play policy is
measured against random play and against a solver.

The seat is the reset seed's (``seed % seats``, so a GRPO group, which shares its seed, shares its seat and its
deal) unless ``seat`` fixes it. The opponents draw their choices from a generator seeded by the reset seed, or by
the episode's own transition seed where a group's members are given one (``independent_transitions``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .base import TRANSITION_SEED, TextEnv
from .games import make_game
from .kuhn_poker import KuhnPokerGame, StrategyPlayer, equilibrium_strategy
from .multi_agent import Player, RandomPlayer, TurnBasedTextGame
from .tic_tac_toe import MinimaxPlayer, TicTacToeGame


def scripted_player(name: str, game: TurnBasedTextGame, seed: Any) -> Player:
    """The opponent ``name`` for ``game``: ``"random"`` (a uniformly random legal move), ``"minimax"`` (perfect
    tic-tac-toe) or ``"equilibrium"`` (Kuhn's equilibrium strategy in Kuhn poker)."""
    rng_seed = np.random.SeedSequence(seed).generate_state(1)[0]
    if name == "random" and game.action_vocabulary:
        return RandomPlayer(rng_seed)
    if name == "minimax" and isinstance(game, TicTacToeGame):
        return MinimaxPlayer(rng_seed)
    if name == "equilibrium" and isinstance(game, KuhnPokerGame):
        return StrategyPlayer(equilibrium_strategy(), rng_seed)
    raise ValueError(
        f"opponent={name!r} does not play {type(game).__name__}: 'random' plays the games with a move list (not "
        "TextArena's), 'minimax' TicTacToe, 'equilibrium' Kuhn poker."
    )


def seat_for_seed(seats, seed: int | None, fixed: str | None = None) -> str:
    """The seat a :class:`SeatEnv` plays after ``reset(seed=seed)``: ``fixed`` when set, else ``seed % seats``."""
    return fixed or seats[int(seed or 0) % len(seats)]


# What counts as a seat's success, by the game's outcome for it.
SUCCESS_RULES = {"win": ("win",), "not_lost": ("win", "draw")}


class SeatEnv(TextEnv):
    """Seat ``seat`` of ``game`` against scripted ``opponent``\\ s, as a single-agent :class:`TextEnv`.

    ## Action Space
    The game's moves (``TurnBasedTextGame.action_vocabulary``); a move of the game that is illegal now reaches the
    game, whose ``illegal_move`` rule decides (a forfeit by default). A piece that is no move of the game is a
    format error for the protocol, and the turn passes without a move.

    ## Observation Space
    What the game shows the seat on its turn (its own cards only), the opponents' moves since included.

    ## Rewards
    The seat's payoff when the game ends (1 a win, -1 a loss, 0 a draw in tic-tac-toe; net chips in Kuhn poker);
    0 before. ``success``: the game is won, or with ``success="not_lost"`` won or drawn (against minimax, which
    cannot be beaten, the best a seat can do). ``info["outcome"]`` at the end: ``"win"``, ``"draw"`` or ``"loss"``.

    ## Arguments
    ``game``: a game id of :func:`rllib_ragen.envs.games.make_game`. ``seat``: the seat played, or None for the
    reset seed's. ``opponent``: ``"random"``, ``"minimax"`` (tic-tac-toe) or ``"equilibrium"`` (Kuhn poker).
    ``game_config``: the game's settings (``{"illegal_move": "retry"}``). ``success``: ``"win"`` or
    ``"not_lost"``, what counts as a success.
    """

    def __init__(
        self,
        game: str = "rllib_ragen/TicTacToe-v0",
        seat: str | None = None,
        opponent: str = "random",
        game_config: Mapping[str, Any] | None = None,
        success: str = "win",
        render_mode: str | None = "ansi",
    ):
        super().__init__(render_mode=render_mode)
        if success not in SUCCESS_RULES:
            raise ValueError(f"success={success!r}: choose one of {list(SUCCESS_RULES)}.")
        self.succeeds_on = SUCCESS_RULES[success]
        self.game = make_game(game, config=dict(game_config or {}))
        if seat is not None and seat not in self.game.possible_agents:
            raise ValueError(f"seat={seat!r}: {game} has seats {list(self.game.possible_agents)}.")
        scripted_player(opponent, self.game, 0)  # fails here, naming the choices, for a game it cannot play
        self.game_id, self.fixed_seat, self.opponent = game, seat, opponent
        self.seat = seat or self.game.possible_agents[0]
        self.action_names = tuple(self.game.action_vocabulary)
        self._action_lookup = {name.lower(): i for i, name in enumerate(self.action_names)}
        self.max_turns = self.game.max_moves

    def describe(self) -> str:
        return self.game.instructions(self.seat)

    def canonical_action(self, text: str) -> str | None:
        if self.action_names:  # one of the game's moves, legal now or not: the game rules on an illegal one
            return super().canonical_action(text)
        return self.game.canonical_action(self.seat, text)

    def state_key(self) -> str:
        return f"{self.seat}\n{self._observation}"  # what the seat saw; the same board seen from either seat differs

    def _render_text(self) -> str:
        return self._observation

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super(TextEnv, self).reset(seed=seed)
        self._success = False
        self.reset_options = options or {}
        seats = self.game.possible_agents
        self.seat = seat_for_seed(seats, seed, self.fixed_seat)
        transition_seed = self.reset_options.get(TRANSITION_SEED)
        luck = [seed or 0] if transition_seed is None else np.atleast_1d(transition_seed).tolist()
        self.opponents = {s: scripted_player(self.opponent, self.game, luck + [i]) for i, s in enumerate(seats)}
        self.game.reset(seed=seed)
        reward = self._opponents_move()
        if self.game.game_over:  # the opponents ended it before the seat's first move (not in these games)
            raise RuntimeError(f"{self.game_id} ended before seat {self.seat!r} moved (payoff {reward})")
        self._observation = self.game.observe(self.seat)
        return self._observation, {"success": False}

    def _opponents_move(self) -> float:
        """Let the other seats move until it is this seat's turn or the game is over; this seat's payoff then."""
        while not self.game.game_over and self.game.to_move() != self.seat:
            mover = self.game.to_move()
            self.game.step({mover: self.opponents[mover](self.game, mover)})
        return float(self.game.payoffs[self.seat]) if self.game.game_over else 0.0

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.game.game_over or self.canonical_action(action) is None:
            # Not a move of the game (or the game is over): as every TextEnv, a legal call that changes nothing.
            info = {"success": self._success, "action_is_valid": False, "action_is_effective": False}
            return self._observation, 0.0, self.game.game_over, False, info
        legal = self.game.canonical_action(self.seat, action) is not None
        *_, truncated, _ = self.game.step({self.seat: action})
        reward = self._opponents_move()
        self._success = self.game.game_over and self.game.outcome(self.seat) in self.succeeds_on
        self._observation = self.game.observe(self.seat)
        # Valid: a move of the game; effective: legal now, so played (an illegal one forfeits, by default).
        info = {"success": self._success, "action_is_valid": True, "action_is_effective": legal}
        if self.game.game_over:
            info["outcome"] = self.game.outcome(self.seat)
        return self._observation, reward, self.game.game_over and not truncated["__all__"], truncated["__all__"], info
