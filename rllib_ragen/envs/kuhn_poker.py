"""Kuhn poker for two seats, and its exact analysis: a game of hidden information and chance whose value is known.

Three cards, J < Q < K; each seat antes 1 chip and is dealt one card. The first seat checks or bets 1. After a check
the second seat checks (showdown for the 2-chip pot) or bets 1, and the first seat then calls (showdown for 4) or
folds. After a bet the second seat calls (showdown for 4) or folds. The higher card wins a showdown.

Kuhn (1950) solved it: at equilibrium the first seat's expected payoff is -1/18 a hand, reached by a family of
strategies with one parameter (:func:`equilibrium_strategy`). :func:`exploitability` measures how far a strategy
is from that: how much a best response would win against it, exactly (fractions), over the 6 deals.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Iterable, Mapping

import numpy as np

from .multi_agent import TurnBasedTextGame

CARDS = ("J", "Q", "K")
SEATS = ("first", "second")
GAME_VALUE = Fraction(-1, 18)  # the first seat's payoff a hand at equilibrium
# Each decision point by the history before it: who decides, and the two moves there (passive, aggressive).
DECISIONS = {
    (): ("first", ("check", "bet")),
    ("check",): ("second", ("check", "bet")),
    ("bet",): ("second", ("fold", "call")),
    ("check", "bet"): ("first", ("fold", "call")),
}
InfoSet = tuple[str, tuple[str, ...]]  # (the decider's card, the moves so far)
Strategy = Mapping[InfoSet, Fraction | float]  # the probability of the aggressive move (bet or call)


def payoff(cards: tuple[str, str], history: tuple[str, ...]) -> int | None:
    """The first seat's payoff once ``history`` ends the hand (dealt ``cards``: first's, second's), else None."""
    showdown = 1 if CARDS.index(cards[0]) > CARDS.index(cards[1]) else -1
    ends = {
        ("check", "check"): showdown,
        ("bet", "call"): 2 * showdown,
        ("bet", "fold"): 1,
        ("check", "bet", "call"): 2 * showdown,
        ("check", "bet", "fold"): -1,
    }
    return ends.get(history)


def info_sets(seat: str) -> list[InfoSet]:
    """Every decision point of ``seat``: its card and the moves before it."""
    return [(card, history) for history, (who, _) in DECISIONS.items() if who == seat for card in CARDS]


def expected_payoff(first: Strategy, second: Strategy) -> Fraction:
    """The first seat's expected payoff a hand when ``first`` plays against ``second``, over the 6 deals."""
    strategies = {"first": first, "second": second}

    def value(cards: tuple[str, str], history: tuple[str, ...]) -> Fraction:
        end = payoff(cards, history)
        if end is not None:
            return Fraction(end)
        seat, (passive, aggressive) = DECISIONS[history]
        p = Fraction(strategies[seat][(cards[SEATS.index(seat)], history)])
        return (1 - p) * value(cards, history + (passive,)) + p * value(cards, history + (aggressive,))

    deals = list(itertools.permutations(CARDS, 2))
    return sum((value(deal, ()) for deal in deals), Fraction(0)) / len(deals)


def best_response_payoff(strategy: Strategy, seat: str) -> Fraction:
    """What the best response in ``seat`` wins a hand against ``strategy`` in the other seat, exactly: the best of
    ``seat``'s 64 pure strategies (a best response is always found among them)."""
    points = info_sets(seat)
    best = None
    for choice in itertools.product((Fraction(0), Fraction(1)), repeat=len(points)):
        pure = dict(zip(points, choice))
        won = expected_payoff(pure, strategy) if seat == "first" else -expected_payoff(strategy, pure)
        best = won if best is None else max(best, won)
    return best


def exploitability(first: Strategy, second: Strategy) -> Fraction:
    """How much best responses win against the pair, beyond the game's value, averaged over the two seats: 0 at an
    equilibrium, positive otherwise. For one policy playing both seats (self-play), pass its two halves."""
    return (best_response_payoff(second, "first") - GAME_VALUE + best_response_payoff(first, "second") + GAME_VALUE) / 2


def equilibrium_strategy(alpha: Fraction = Fraction(1, 6)) -> dict[InfoSet, Fraction]:
    """Kuhn's equilibrium for both seats, with the first seat's bluffing rate ``alpha`` in [0, 1/3]: it bets J with
    probability alpha, K with 3 alpha, and calls a bet with Q at alpha + 1/3; the second seat bluffs J at 1/3 after a
    check and calls a bet with Q at 1/3."""
    alpha = Fraction(alpha)
    if not 0 <= alpha <= Fraction(1, 3):
        raise ValueError(f"alpha={alpha} must be in [0, 1/3].")
    third = Fraction(1, 3)
    return {
        ("J", ()): alpha,
        ("Q", ()): Fraction(0),
        ("K", ()): 3 * alpha,
        ("J", ("check", "bet")): Fraction(0),
        ("Q", ("check", "bet")): alpha + third,
        ("K", ("check", "bet")): Fraction(1),
        ("J", ("bet",)): Fraction(0),
        ("Q", ("bet",)): third,
        ("K", ("bet",)): Fraction(1),
        ("J", ("check",)): third,
        ("Q", ("check",)): Fraction(0),
        ("K", ("check",)): Fraction(1),
    }


def decision_views() -> dict[str, tuple[str, InfoSet]]:
    """What a seat is shown at each of its decision points (:meth:`KuhnPokerGame.observe`: its card and the moves so
    far, never the other card) -> (the seat, the decision point): how a played hand's turns are read back."""
    game, views = KuhnPokerGame(), {}
    for history, (seat, _) in DECISIONS.items():
        for card in CARDS:
            other = next(c for c in CARDS if c != card)  # hidden from the seat: any other card shows the same
            game.reset(seed=0)
            game.cards, game.history = ((card, other) if seat == "first" else (other, card)), history
            views[game.observe(seat)] = (seat, (card, history))
    return views


def strategy_from_play(decisions: Iterable[tuple[str, str]]) -> dict:
    """A strategy estimated from played decisions, and its exploitability.

    Args:
        decisions: ``(view, move)`` per decision: what the seat was shown (:meth:`KuhnPokerGame.observe`) and the
            move it made there ("" where it made no legal move: a forfeit, or with ``illegal_move="retry"`` a retry).

    Returns:
        ``counts`` (per decision point, as ``"K after check"``: how often the passive move, the aggressive move and
        no legal move were made), ``strategy`` (the aggressive move's share of the legal moves made, by decision
        point; 1/2 where none was made), ``unvisited`` (those decision points), ``no_move_rate`` (of all decisions)
        and ``exploitability`` (:func:`exploitability` of the estimate, its two seats' halves; a float). A decision
        point a seat never reaches by its own moves cannot change its exploitability, whatever the estimate there.
    """
    views = decision_views()
    counts = {point: [0, 0, 0] for seat in SEATS for point in info_sets(seat)}
    for view, move in decisions:
        seat, point = views[view]
        passive, aggressive = DECISIONS[point[1]][1]
        counts[point][{passive: 0, aggressive: 1}.get(move, 2)] += 1
    strategy = {p: Fraction(c[1], c[0] + c[1]) if c[0] + c[1] else Fraction(1, 2) for p, c in counts.items()}
    halves = [{p: strategy[p] for p in info_sets(seat)} for seat in SEATS]
    total = sum(sum(c) for c in counts.values())
    return {
        "counts": {_point_name(p): dict(zip(("passive", "aggressive", "none"), c)) for p, c in counts.items()},
        "strategy": {_point_name(p): float(v) for p, v in strategy.items()},
        "unvisited": [_point_name(p) for p, c in counts.items() if not c[0] + c[1]],
        "no_move_rate": sum(c[2] for c in counts.values()) / max(total, 1),
        "exploitability": float(exploitability(*halves)),
    }


def _point_name(point: InfoSet) -> str:
    card, history = point
    return f"{card} after {' '.join(history)}" if history else f"{card} first"


class KuhnPokerGame(TurnBasedTextGame):
    """One hand of Kuhn poker between seats ``"first"`` and ``"second"``; the deal is drawn from ``reset``'s seed.

    ## Action Space
    ``"check"`` or ``"bet"`` when no bet is open, ``"call"`` or ``"fold"`` facing one.

    ## Observation Space
    The seat's own card (never the other's before a showdown), the moves so far and the legal moves.

    ## Rewards
    Each seat's net chips when the hand ends: 1 or 2 to the winner of a showdown or a fold, the same lost by the
    other.
    """

    possible_agents = SEATS
    action_vocabulary = ("check", "bet", "call", "fold")
    max_moves = 16

    def _reset_state(self) -> None:
        deal = self.np_random.permutation(len(CARDS))[:2]
        self.cards: tuple[str, str] = (CARDS[deal[0]], CARDS[deal[1]])
        self.history: tuple[str, ...] = ()

    def card(self, seat: str) -> str:
        return self.cards[SEATS.index(seat)]

    def info_set(self, seat: str) -> InfoSet:
        return self.card(seat), self.history

    def to_move(self) -> str:
        return DECISIONS[self.history][0] if self.history in DECISIONS else SEATS[len(self.history) % 2]

    def legal_actions(self, seat: str) -> list[str]:
        if self.game_over or self.history not in DECISIONS or DECISIONS[self.history][0] != seat:
            return []
        return list(DECISIONS[self.history][1])

    def _play(self, seat: str, action: str) -> dict[str, float] | None:
        self.history += (action,)
        end = payoff(self.cards, self.history)
        return None if end is None else {"first": float(end), "second": float(-end)}

    def observe(self, seat: str) -> str:
        lines = [f"Your card: {self.card(seat)}."]
        for who, move in zip(itertools.cycle(SEATS), self.history):
            verb = {"check": "checked", "bet": "bet 1 chip", "call": "called", "fold": "folded"}[move]
            lines.append(f"{'You' if who == seat else 'Your opponent'} {verb}.")
        if self.game_over:
            if self.illegal_by is not None:
                lines.append(self.forfeit_note(seat))
            elif self.history[-1] != "fold":
                lines.append(f"Showdown: your opponent held {self.card(SEATS[1 - SEATS.index(seat)])}.")
            won = self.payoffs[seat]
            lines.append(f"You {'won' if won > 0 else 'lost'} {abs(won):g} chip{'s' if abs(won) != 1 else ''}.")
        else:
            lines.append(f"Your move: {' or '.join(self.legal_actions(seat))}.")
        return "\n".join(lines)

    def describe(self, seat: str) -> str:
        order = "You act first." if seat == "first" else "Your opponent acts first."
        return (
            "Kuhn poker: a deck of three cards, J < Q < K. Each player antes 1 chip and is dealt one card; the "
            "other's card stays hidden. With no bet open a player may check or bet 1 chip; facing a bet, call (match "
            "it) or fold (give up the pot). After two checks, or a bet and a call, the higher card wins the pot. "
            f"{order} Answer one move: check, bet, call or fold."
        )


class StrategyPlayer:
    """Plays a Kuhn poker strategy (the aggressive move's probability at each decision point), drawing from its own
    generator; :func:`equilibrium_strategy` gives Kuhn's."""

    def __init__(self, strategy: Strategy, seed: int | None = None):
        self.strategy = strategy
        self.rng = np.random.default_rng(seed)

    def __call__(self, game: KuhnPokerGame, seat: str) -> str:
        passive, aggressive = DECISIONS[game.history][1]
        return aggressive if self.rng.random() < float(self.strategy[game.info_set(seat)]) else passive
