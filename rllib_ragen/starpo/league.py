"""Frozen snapshots of the learner as self-play opponents: a league.

Pure self-play (SPIRAL's setting) trains the policy against itself only. With ``league_interval=k`` the learner's
policy is frozen into the league at iteration 0 (the warm start) and every k iterations after, the newest
``league_size`` kept. Each training group then plays either self-play (the policy in every seat, both seats trained)
or, drawn uniformly with the league's snapshots, the learner in one seat (the group's reset seed's, so that a group
shares its role and its GRPO baseline) against one frozen snapshot, whose seats are played but never trained: their
trajectories leave the batch, and no optimizer ever sees their weights. The learner's outcomes against the league
are logged as ``league/win_rate``, ``league/draw_rate``, ``league/loss_rate``.

A snapshot is the policy's tensors under the Hugging Face model's names (LoRA merged), cloned to the CPU: a copy of
the model's weights each (SmolLM2-135M in float32: 0.54 GB). They are part of the algorithm's checkpoint, so a
resumed run plays the same league. Env runners build a sampler of their own for each snapshot they play
(``TextEnvRunner``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .. import metrics as M
from ..envs.multi_agent import OTHER_SEATS_OUTCOME
from ..envs.seat import seat_for_seed
from ..rollout.seats import DEFAULT_POLICY

SELF_PLAY = None  # a group's opponent: the learner itself, in every seat


class League:
    """The snapshots of one run: name -> policy tensors, oldest first."""

    def __init__(self, interval: int, size: int):
        self.interval, self.size = interval, size
        self.snapshots: dict[str, dict[str, torch.Tensor]] = {}

    def due(self, iteration: int) -> bool:
        """Whether the learner joins the league before iteration ``iteration``'s rollout."""
        return bool(self.interval) and iteration % self.interval == 0 and self.name(iteration) not in self.snapshots

    @staticmethod
    def name(iteration: int) -> str:
        return f"snapshot_{iteration}"

    @staticmethod
    def iteration(name: str) -> int:
        """The iteration of snapshot ``name`` (:meth:`name`'s inverse)."""
        return int(name.rpartition("_")[2])

    def add(self, iteration: int, policy: dict[str, torch.Tensor]) -> None:
        """Freeze ``policy`` (the learner's tensors, cloned here) as the snapshot of ``iteration``; the oldest
        snapshot leaves once more than ``size`` are held."""
        self.snapshots[self.name(iteration)] = {k: v.detach().to("cpu", copy=True) for k, v in policy.items()}
        while len(self.snapshots) > self.size:
            del self.snapshots[next(iter(self.snapshots))]

    def draw(self, groups: int, seed: Sequence[int]) -> list[str | None]:
        """Each group's opponent, uniformly among self-play and the snapshots, from a generator seeded by
        ``seed`` (the run's seed and the iteration: the same draws when a run is resumed)."""
        choices = [SELF_PLAY, *self.snapshots]
        picks = np.random.default_rng(list(seed)).integers(len(choices), size=groups)
        return [choices[int(i)] for i in picks]

    def get_state(self) -> dict:
        return {"snapshots": dict(self.snapshots)}

    def set_state(self, state: dict) -> None:
        self.snapshots = dict(state["snapshots"])


def learner_seat(seats: Sequence[str], seed: int) -> str:
    """The seat the learner plays in a group against a snapshot: the reset seed's, as a seat environment's."""
    return seat_for_seed(seats, seed)


def league_metrics(trajectories, opponents: Sequence[str | None], league_size: int) -> dict[str, float]:
    """The learner's outcomes in the games it played against a snapshot, and the league's size.

    ``trajectories``: every seat's, learner's and snapshots', with group ids as played (index into ``opponents``,
    before the per-seat regrouping). A game where the learner never moved (the snapshot forfeited its first move)
    counts by the snapshot's outcome, mirrored."""
    outcomes: dict[tuple, str] = {}
    for t in sorted(trajectories, key=lambda t: t.policy_id == DEFAULT_POLICY):  # the learner's own last: it wins
        if opponents[t.group] is not SELF_PLAY:
            mine = t.policy_id == DEFAULT_POLICY
            outcomes[(t.group, t.game)] = t.outcome if mine else OTHER_SEATS_OUTCOME[t.outcome]
    metrics = {M.LEAGUE_SNAPSHOTS: float(league_size)}
    if outcomes:
        counted = list(outcomes.values())
        metrics.update({f"{M.LEAGUE}/{o}_rate": counted.count(o) / len(counted) for o in M.GAME_OUTCOMES})
        metrics[M.LEAGUE_GAMES] = float(len(counted))
    return metrics
