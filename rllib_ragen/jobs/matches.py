"""Saved policies played against each other in a built-in game, paired before and after RL.

A job's validation plays one seat against scripted opponents (``validation_envs``: random play, minimax). This module
plays a model against another model, the self-play job's "against its own warm start"
(:func:`rllib_ragen.starpo.game_matches.play_against` plays the games): the agent takes one seat (the first on even
seeds, the second on odd ones, as ``SeatEnv``), the opponent the other, every seat in its own conversation
(:func:`rllib_ragen.rollout.seats.play_games`), sampled at the validation's temperature with the validation's sampling
seed. Greedy play would repeat one game per seat: the opening is the same empty board.

``paired_matches(config, before, after, opponent)`` plays ``before`` and then ``after`` against ``opponent`` on the
same games (seeds, seats, sampling seed) and pairs each game's score for the agent (1 a win, 0 a draw, -1 a loss)
with :func:`~rllib_ragen.jobs.paired_stats.paired_comparison`.

``league_ratings(trial)`` rates a league run's players against each other: its warm start, the snapshots the league
held at the end (exported with the policy) and the trained policy, each pair on the same games, fitted by
Bradley-Terry (:func:`rllib_ragen.jobs.ratings.bradley_terry`).

In Kuhn poker :func:`kuhn_strategy` reads a policy's strategy from its play against the random player, and how
exploitable it is (:func:`rllib_ragen.envs.kuhn_poker.strategy_from_play`).

Example::

    result = paired_matches(config, "outputs/selfplay/warm_starts/<key>", "RUN/seed0/policy", opponent=warm_start)
    print(result["paired"]["describe"])
"""

from __future__ import annotations

from typing import Sequence

from .. import metrics as M
from ..envs.multi_agent import OTHER_SEATS_OUTCOME
from ..starpo.game_matches import MATCH_SEED_START, play_against, play_one_seat
from .paired_stats import paired_comparison
from .ratings import bradley_terry

__all__ = [
    "MATCH_SEED_START",
    "against_warm_start",
    "kuhn_strategy",
    "kuhn_strategy_of_trial",
    "league_ratings",
    "match_outcomes",
    "paired_matches",
    "play_against",
    "round_robin",
]

# A game's score for the agent: its outcome (a trajectory's reward also holds its format penalties).
SCORES = {"win": 1.0, "draw": 0.0, "unfinished": 0.0, "loss": -1.0}


def match_outcomes(trajectories: Sequence) -> dict:
    """The agent's outcome in each game of :func:`play_against`'s ``trajectories`` (keyed by seed; the mirror of
    the opponent's where the agent never moved), its score (1 a win, 0 a draw or an unfinished game, -1 a loss),
    the mean score and the win, draw, loss and unfinished rates."""
    outcomes = {t.seed: OTHER_SEATS_OUTCOME[t.outcome] for t in trajectories if t.policy_id == "opponent"}
    outcomes.update({t.seed: t.outcome for t in trajectories if t.policy_id == "agent"})
    scores = {seed: SCORES[outcome] for seed, outcome in outcomes.items()}
    counted = list(outcomes.values())
    rates = {f"{o}_rate": counted.count(o) / max(len(counted), 1) for o in M.GAME_OUTCOMES}
    return {"games": len(scores), "mean_score": sum(scores.values()) / max(len(scores), 1), **rates, "scores": scores}


def paired_matches(config, before: str, after: str, opponent: str, games: int = 256, *, device: str = "cpu") -> dict:
    """``before`` and ``after`` (model folders) each against ``opponent`` on the same games; their outcomes and the
    paired difference of the agent's score (interval, p-value)."""
    played = {
        name: match_outcomes(play_against(config, folder, opponent, games, device=device))
        for name, folder in (("before", before), ("after", after))
    }
    paired = paired_comparison(played["before"]["scores"], played["after"]["scores"])
    return {**played, "paired": {**paired.as_dict(), "describe": paired.describe()}}


def kuhn_strategy(config, policy: str, hands: int = 1024, *, device: str = "cpu") -> dict:
    """``policy`` (a model folder) in one seat of ``hands`` Kuhn poker hands (the first on even seeds) against the
    random player, sampled as in :func:`play_against`: the strategy its moves show at each decision point, and that
    strategy's exploitability (:func:`rllib_ragen.envs.kuhn_poker.strategy_from_play`; 0 at an equilibrium, in chips
    a hand). Against the random player every decision point comes up (it bets and checks), which play against itself
    would not: a policy that never bets never meets a bet there. Each reply reads only the view of its decision point
    under a single-turn window, so the opponent changes which points come up, not what the policy does at them."""
    from ..envs.kuhn_poker import strategy_from_play

    decisions = [
        (key.split("\n", 1)[1], actions[0] if actions else "")
        for t in play_one_seat(config, policy, "random", hands, device=device)
        for key, actions in zip(t.turn_states, t.turn_actions, strict=True)
    ]
    return {"hands": hands, "opponent": "random", **strategy_from_play(decisions)}


MATCHES_FILE = "matches_vs_warm_start.json"
STRATEGY_FILE = "kuhn_strategy.json"


def against_warm_start(trial: str, games: int = 256, *, device: str = "cpu", allow_imports: bool = False) -> dict:
    """A finished trial's exported ``policy/`` and its warm start (the model its settings name), each against the
    warm start on the same ``games`` games: the self-play job's third opponent, beside validation's scripted ones.
    Written to ``<trial>/matches_vs_warm_start.json``; a file already there is the run's record and stays: the
    figures are returned only. ``allow_imports``: a run folder whose settings name an import path is refused unless
    it is a run you trust (:func:`rllib_ragen.jobs.readers.trial_config`)."""
    config, warm_start, policy = _trial_policies(trial, allow_imports)
    result = {"opponent": warm_start, **paired_matches(config, warm_start, policy, warm_start, games, device=device)}
    return _recorded(trial, MATCHES_FILE, result)


def kuhn_strategy_of_trial(trial: str, hands: int = 2048, *, device: str = "cpu", allow_imports: bool = False) -> dict:
    """A finished Kuhn poker trial's warm start and exported ``policy/``, each read as a strategy from ``hands``
    hands against the random player (:func:`kuhn_strategy`), with its exploitability. Written to
    ``<trial>/kuhn_strategy.json`` unless a file is there already (the run's record stays; the figures are returned
    only). ``allow_imports``: as :func:`against_warm_start`'s."""
    config, warm_start, policy = _trial_policies(trial, allow_imports)
    result = {
        "warm_start": kuhn_strategy(config, warm_start, hands, device=device),
        "trained": kuhn_strategy(config, policy, hands, device=device),
    }
    return _recorded(trial, STRATEGY_FILE, result)


RATINGS_FILE = "league_ratings.json"
WARM_START, TRAINED = "warm start", "trained"


def league_ratings(trial: str, games: int = 64, *, device: str = "cpu", allow_imports: bool = False) -> dict:
    """A finished league trial's players rated against each other: its warm start (the anchor, rated 0), each
    snapshot its league held at the end (``<trial>/league/snapshot_<iteration>``; the snapshot of iteration 0 is the
    warm start's weights and is played as the warm start) and its exported policy. Every pair plays the same
    ``games`` deals twice, the seats swapped (duplicate play: the deals' luck and the first mover's edge cancel, so
    two players who play alike score exactly even), both sampled as in :func:`play_against`; a game scores 1 a win,
    0.5 a draw or an unfinished game, 0 a loss, and :func:`~rllib_ragen.jobs.ratings.bradley_terry` fits the ratings.
    Written to ``<trial>/league_ratings.json`` unless the run recorded it already. ``allow_imports``: as
    :func:`against_warm_start`'s."""
    import pathlib

    from ..starpo.league import League
    from .outputs import LEAGUE

    config, warm_start, policy = _trial_policies(trial, allow_imports)
    league = pathlib.Path(trial) / LEAGUE
    folders = [p for p in league.iterdir() if p.is_dir() and p.name.startswith("snapshot_")] if league.is_dir() else []
    snapshots = sorted(folders, key=lambda p: League.iteration(p.name))
    if not snapshots:
        raise FileNotFoundError(f"{league} holds no snapshots: was {trial} trained with a league (league_interval)?")
    players = {
        WARM_START: warm_start,
        **{s.name: str(s) for s in snapshots if League.iteration(s.name) > 0},
        TRAINED: policy,
    }
    results, pairs = round_robin(config, players, games, device=device)
    ratings = bradley_terry(results, anchor=WARM_START)
    result = {"games_per_pair": games, "players": players, "pairs": pairs, "ratings": ratings.as_dict()}
    return {**_recorded(trial, RATINGS_FILE, result), "table": ratings.table()}


def round_robin(config, players: dict[str, str], games: int, *, device: str = "cpu") -> tuple[dict, dict]:
    """Every pair of ``players`` (name -> model folder) on the same ``games`` deals twice, the seats swapped
    (:func:`play_against`'s seat by seed, the agent's then the opponent's). Returns each pair ``(a, b)``'s scores
    for ``a`` (1 a win, 0.5 a draw or an unfinished game, 0 a loss; its games as agent, then as opponent) and each
    direction's :func:`match_outcomes` (``"a vs b"``, ``a`` the agent) without the per-game scores."""
    import itertools

    results, pairs = {}, {}
    for a, b in itertools.combinations(players, 2):
        results[(a, b)] = []
        for agent, opponent in ((a, b), (b, a)):
            played = match_outcomes(play_against(config, players[agent], players[opponent], games, device=device))
            results[(a, b)] += [(1 + score if agent == a else 1 - score) / 2 for score in played["scores"].values()]
            pairs[f"{agent} vs {opponent}"] = {k: v for k, v in played.items() if k != "scores"}
    return results, pairs


def _trial_policies(trial: str, allow_imports: bool) -> tuple:
    """A finished trial's config (read as data unless ``allow_imports``), the warm start its settings name, and its
    exported policy's folder."""
    import pathlib

    from .outputs import POLICY
    from .readers import trial_config

    config = trial_config(pathlib.Path(trial), allow_imports)
    return config, str(config.model_config["model"]), str(pathlib.Path(trial) / POLICY)


def _recorded(trial: str, name: str, result: dict) -> dict:
    """``result`` written to ``<trial>/<name>`` whole or not at all, unless the run already recorded it there."""
    import json
    import pathlib

    from ..files import write_text_atomically
    from .outputs import json_ready

    target = pathlib.Path(trial) / name
    if not target.exists():
        write_text_atomically(target, json.dumps(json_ready(result), indent=1, sort_keys=True))
    return result
