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

Example::

    result = paired_matches(config, "outputs/selfplay/warm_starts/<key>", "RUN/seed0/policy", opponent=warm_start)
    print(result["paired"]["describe"])
"""

from __future__ import annotations

from typing import Sequence

from .. import metrics as M
from ..envs.multi_agent import OTHER_SEATS_OUTCOME
from ..starpo.game_matches import MATCH_SEED_START, play_against
from .paired_stats import paired_comparison

__all__ = ["MATCH_SEED_START", "against_warm_start", "match_outcomes", "paired_matches", "play_against"]

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


MATCHES_FILE = "matches_vs_warm_start.json"


def against_warm_start(trial: str, games: int = 256, *, device: str = "cpu") -> dict:
    """A finished trial's exported ``policy/`` and its warm start (the model its settings name), each against the
    warm start on the same ``games`` games: the self-play job's third opponent, beside validation's scripted ones.
    Written to ``<trial>/matches_vs_warm_start.json``; a file already there is the run's record and stays: the
    figures are returned only."""
    import json
    import pathlib

    from ..files import write_text_atomically
    from .outputs import POLICY, json_ready
    from .readers import trial_config

    trial = pathlib.Path(trial)
    config = trial_config(trial, allow_imports=True)  # the job's own trial
    warm_start = str(config.model_config["model"])
    result = {"opponent": warm_start, **paired_matches(config, warm_start, str(trial / POLICY), warm_start, games)}
    target = trial / MATCHES_FILE
    if not target.exists():
        write_text_atomically(target, json.dumps(json_ready(result), indent=1, sort_keys=True))
    return result
