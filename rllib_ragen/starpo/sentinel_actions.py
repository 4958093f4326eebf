"""What StarPO does when the sentinel's rules fire (``rllib_ragen/sentinel.py`` decides when): warn, stop the run,
or roll back to a healthy snapshot of the learner's weights and optimizer state with new knobs."""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import shutil
import tempfile
from typing import TYPE_CHECKING

import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from .. import metrics as M
from ..files import written_whole
from ..sentinel import Firing

if TYPE_CHECKING:
    from .starpo import StarPO

logger = logging.getLogger(__name__)


class SentinelActions(RLlibCallback):
    """The sentinel's actions on one algorithm, as an RLlib callback: after each iteration (RLlib's
    ``on_train_result``, so they see and extend the result Tune records), and its rollback points: every
    ``sentinel_snapshot_interval``-th healthy iteration, the last ``sentinel_rollback_depth`` kept in a temporary
    folder (with a rollback rule only). StarPO puts it first among the algorithm's callbacks."""

    def __init__(self, algorithm: "StarPO"):
        super().__init__()
        self.algorithm = algorithm
        self.sentinel = algorithm.sentinel
        rollback = any(rule.action == "rollback" for rule in self.sentinel.rules)
        self.snapshot_dir = tempfile.mkdtemp(prefix="rllib_ragen_sentinel_") if rollback else None

    def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
        if algorithm is self.algorithm and self.sentinel.rules:
            self.after_iteration(algorithm.iteration, result)  # Tune counted the iteration before this hook

    def after_iteration(self, iteration: int, result: dict) -> None:
        """Observe ``result`` (iteration ``iteration``'s), act on what fired, and add the sentinel's metrics."""
        fired = self.sentinel.observe(iteration, result)
        rolled_back = False
        for firing in fired:
            if firing.action == "rollback" and rolled_back:  # one rollback per iteration, whatever fired it
                firing.done = "covered by this iteration's rollback"
            else:
                self._act_on(firing)
                rolled_back |= firing.action == "rollback"
            logger.warning(firing.describe())
        if (
            not fired
            and self.sentinel.healthy
            and self.snapshot_dir is not None
            and iteration % self.algorithm.config.sentinel_snapshot_interval == 0
        ):
            self._save_healthy_snapshot(iteration)
        result.update(
            {
                M.SENTINEL_FIRINGS: float(len(fired)),
                M.SENTINEL_TOTAL_FIRINGS: float(len(self.sentinel.firings)),
                M.SENTINEL_ROLLBACKS: float(self.sentinel.rollbacks),
                M.SENTINEL_LR_FACTOR: self.sentinel.lr_factor,
                M.SENTINEL_STOP: float(self.sentinel.stopped),
                M.SENTINEL_EVENTS: json.dumps([dataclasses.asdict(f) for f in fired]),
            }
        )
        if self.sentinel.stopped:
            result["done"] = True  # ends a Tune trial and a main job's loop

    def _act_on(self, firing: Firing) -> None:
        if firing.action == "stop":
            self.sentinel.stopped = True
            firing.done = "stopped the run (result['done'] = True)"
        elif firing.action == "rollback":
            firing.done = self._roll_back(firing)
        else:
            firing.done = "warned"

    def _snapshots(self) -> list[pathlib.Path]:
        """The kept rollback points, oldest first."""
        return sorted(pathlib.Path(self.snapshot_dir).glob("healthy_*.pt"), key=lambda p: int(p.stem.split("_")[1]))

    def _save_healthy_snapshot(self, iteration: int) -> None:
        """The learner's weights and optimizer state now, atomically, as a rollback point; the last
        ``sentinel_rollback_depth`` are kept."""
        state = self.algorithm.learner_group.get_state(
            components=[f"learner/{COMPONENT_RL_MODULE}", f"learner/{COMPONENT_OPTIMIZER}"]
        )["learner"]
        path = pathlib.Path(self.snapshot_dir) / f"healthy_{iteration}.pt"
        with written_whole(path) as partial:
            torch.save({"iteration": iteration, "learner": state}, partial)
        for old in self._snapshots()[: -self.algorithm.config.sentinel_rollback_depth]:
            old.unlink()

    def _roll_back(self, firing: Firing) -> str:
        """Restore the oldest kept snapshot (if any), apply the rule's knobs, send the weights to the rollout."""
        algorithm, snapshots, words = self.algorithm, self._snapshots(), []
        if snapshots:
            snapshot = torch.load(snapshots[0], weights_only=False)
            for newer in snapshots[1:]:  # on the path that went wrong
                newer.unlink()
            state = snapshot["learner"]
            # Newer than the learners' and the env runners' current weights, or they would refuse it.
            current = max(
                r.get() for r in algorithm.learner_group.foreach_learner(lambda learner: learner._weights_seq_no)
            )
            state[WEIGHTS_SEQ_NO] = int(current) + 1
            algorithm.learner_group.set_state({"learner": state})
            words.append(f"restored the weights and optimizer state of iteration {snapshot['iteration']}")
        else:
            words.append("no healthy snapshot yet: weights kept")
        self.sentinel.after_rollback(firing.rule)
        self.apply_lr_factor()
        if algorithm.rollouts.in_flight:
            algorithm.rollouts.drop()
            words.append("dropped the rollout played beside the update")
        rule = next(r for r in self.sentinel.rules if r.label == firing.rule)
        words += [
            f"{knob} -> {value:g}"
            if knob != "lr_factor"
            else f"learning rates x{value:g} (now x{self.sentinel.lr_factor:g})"
            for knob, value in rule.knobs.items()
        ]
        algorithm.sync_rollout_weights()
        return "; ".join(words)

    def apply_lr_factor(self) -> None:
        factor = self.sentinel.lr_factor
        self.algorithm.learner_group.foreach_learner(lambda learner: learner.set_lr_factor(factor))

    def cleanup(self) -> None:
        if self.snapshot_dir is not None:
            shutil.rmtree(self.snapshot_dir, ignore_errors=True)
