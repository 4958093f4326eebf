"""Ratings from games between several players: a Bradley-Terry fit on the Elo scale, with 95% intervals.

Each game scores 1 for a win, 1/2 for a draw and 0 for a loss. The Bradley-Terry model gives player i the strength
theta_i and says i scores against j with probability sigmoid(theta_i - theta_j); the ratings are the maximum-likelihood
strengths, the ``anchor`` player fixed at 0, shown in Elo points (400 / ln 10 per unit: 100 points ahead expects 64%
of the points). A draw counts as half a win each way, as Elo does. ``prior_draws`` adds that many draws to every pair
that played (BayesElo's prior), so a player who won every game still gets a finite rating; 0 fits the games alone.
The intervals are the normal ones from the fit's observed information (the curvature of the log-likelihood), each
relative to the anchor.

Example::

    ratings = bradley_terry({("warm start", "trained"): [0, 0.5, 1, 0], ...}, anchor="warm start")
    print(ratings.table())
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from .paired_stats import Z_95

__all__ = ["ELO_PER_UNIT", "Ratings", "bradley_terry"]

ELO_PER_UNIT = 400 / math.log(10)  # Elo points per unit of theta: a 400-point gap expects 10 to 1
POINTS_TOLERANCE = 1e-9  # how far a player's fitted expected points may lie from its points


@dataclasses.dataclass(frozen=True)
class Ratings:
    """Each player's Elo rating relative to ``anchor``, its 95% interval, and its record (points and games)."""

    anchor: str
    players: list[str]
    elo: list[float]
    ci_low: list[float]
    ci_high: list[float]
    points: list[float]
    games: list[int]
    prior_draws: float

    def expected_score(self, player: str, opponent: str) -> float:
        """The fitted share of the points ``player`` takes from ``opponent``."""
        gap = self.elo[self.players.index(player)] - self.elo[self.players.index(opponent)]
        return 1 / (1 + math.exp(-gap / ELO_PER_UNIT))

    def table(self) -> str:
        """A Markdown table, one row a player, strongest first."""
        rows = ["| player | Elo, against " + self.anchor + " [95% CI] | points / games |", "|---|---|---|"]
        for i in sorted(range(len(self.players)), key=lambda i: -self.elo[i]):
            interval = "" if self.players[i] == self.anchor else f" [{self.ci_low[i]:+.0f}, {self.ci_high[i]:+.0f}]"
            rows.append(f"| {self.players[i]} | {self.elo[i]:+.0f}{interval} | {self.points[i]:g} / {self.games[i]} |")
        return "\n".join(rows)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def bradley_terry(results: Mapping[tuple[str, str], Sequence[float]], anchor: str, prior_draws: float = 1.0) -> Ratings:
    """Bradley-Terry ratings from ``results``: for each pair ``(a, b)`` that played, ``a``'s score in each game (1 a
    win, 0.5 a draw, 0 a loss). ``anchor`` is rated 0. Every player must be connected to the anchor by games.

    Raises:
        ValueError: a score outside [0, 1], an anchor that never played, a player not connected to the anchor, or
            (with ``prior_draws=0``) a player who won or lost every game, whose rating would be infinite.
    """
    from scipy.optimize import minimize
    from scipy.special import expit, log_expit

    players = list(dict.fromkeys(p for pair in results for p in pair))
    if anchor not in players:
        raise ValueError(f"anchor {anchor!r} played no game; the players are {players}.")
    index = {p: i for i, p in enumerate(players)}
    n = len(players)
    won, played = np.zeros((n, n)), np.zeros((n, n))  # won[i, j]: points i took from j; played is symmetric
    for (a, b), scores in results.items():
        if any(not 0.0 <= s <= 1.0 for s in scores):
            raise ValueError(f"scores of {a} against {b} must lie in [0, 1] (1 a win, 0.5 a draw, 0 a loss).")
        i, j = index[a], index[b]
        won[i, j] += sum(scores)
        won[j, i] += len(scores) - sum(scores)
        played[i, j] += len(scores)
        played[j, i] += len(scores)
    _check_connected(players, played, anchor)
    fitted_won = won + prior_draws / 2 * (played > 0)
    fitted_played = played + prior_draws * (played > 0)
    if prior_draws == 0:
        unbounded = [p for p in players if won[index[p]].sum() in (0.0, played[index[p]].sum())]
        if unbounded:
            raise ValueError(f"{unbounded} won or lost every game: the fit needs prior_draws > 0 to rate them.")
    free = [i for i in range(n) if i != index[anchor]]

    def strengths(x: np.ndarray) -> np.ndarray:
        theta = np.zeros(n)
        theta[free] = x
        return theta

    def negative_log_likelihood(x: np.ndarray) -> tuple[float, np.ndarray]:
        gaps = strengths(x)[:, None] - strengths(x)[None, :]
        # -sum won[i, j] * log sigmoid(theta_i - theta_j), each game counted from both sides' points
        value = float(-(fitted_won * log_expit(gaps)).sum())
        gradient = (fitted_played * expit(gaps) - fitted_won).sum(1)
        return value, gradient[free]

    def information(x: np.ndarray) -> np.ndarray:
        gaps = strengths(x)[:, None] - strengths(x)[None, :]
        weights = fitted_played * expit(gaps) * expit(-gaps)
        return (np.diag(weights.sum(1)) - weights)[np.ix_(free, free)]

    fit = minimize(negative_log_likelihood, np.zeros(n - 1), jac=True, hess=information, method="trust-exact")
    x = fit.x
    for _ in range(3):  # Newton on the gradient alone: near the optimum the likelihood's value rounds off its changes
        x = x - np.linalg.solve(information(x), negative_log_likelihood(x)[1])
    # Fitted: each player's expected points equal its points (the likelihood's gradient is zero).
    residual = float(np.abs(negative_log_likelihood(x)[1]).max(initial=0.0))
    if not residual <= POINTS_TOLERANCE:
        raise RuntimeError(f"the Bradley-Terry fit did not converge ({fit.message}): points off by {residual:.2g}.")
    theta = strengths(x)
    spread = np.zeros(n)
    spread[free] = np.sqrt(np.diag(np.linalg.inv(information(x))))
    return Ratings(
        anchor=anchor,
        players=players,
        elo=[float(t * ELO_PER_UNIT) for t in theta],
        ci_low=[float((t - Z_95 * s) * ELO_PER_UNIT) for t, s in zip(theta, spread)],
        ci_high=[float((t + Z_95 * s) * ELO_PER_UNIT) for t, s in zip(theta, spread)],
        points=[float(v) for v in won.sum(1)],
        games=[int(v) for v in played.sum(1)],
        prior_draws=prior_draws,
    )


def _check_connected(players: list[str], played: np.ndarray, anchor: str) -> None:
    """Every player reached from the anchor through pairs that played: otherwise its rating has nothing to stand on."""
    from scipy.sparse.csgraph import connected_components

    _, component = connected_components(played > 0, directed=False)
    apart = [p for p, c in zip(players, component) if c != component[players.index(anchor)]]
    if apart:
        raise ValueError(f"{apart} played no game linked to {anchor!r}: they cannot be rated against it.")
