"""StarPO and StarPO-S (arXiv 2504.20073) as an RLlib algorithm (its config: ``config.py``, its knobs: ``knobs.py``).

One training step reads top to bottom: rollout (P groups x N episodes from the env runners, played where and when
``rollout_scheduler.py`` says: fanned out, restarted, or beside the previous update) -> prepare (the
reward-variance rollout filter, rewards on tokens, padding: ``update_batch.py``) -> update (the learner group:
every estimator's advantages, ``batch_advantages.py``, then the optimizer steps, ``starpo_learner.py``) -> sync
(new weights to the env runners, or to the vLLM engines: ``inference_engines.py``). Every ``validation_interval``
steps the fixed validation set is played at the validation temperature. After each step the sentinel's rules may
warn, stop or roll back (``sentinel_actions.py``).

Example::

    config = (StarPOConfig()
              .environment("rllib_ragen/Bandit-v0")
              .rl_module(model_config={"model": "tiny"})
              .training(num_groups=4, group_size=8, lr=1e-4))
    algo = config.build_algo()
    print(algo.train()["env_runners"]["rllib_ragen/Bandit-v0/success"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Callable

import numpy as np
import ray
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils import force_list
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    EVALUATION_RESULTS,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
)

from .. import metrics as M
from ..collapse import cross_scoring_pairs, probe_schedule, reply_diagnostics
from ..hardware import peak_rss_gib, trim_heap
from ..objectives import RoleBaselines
from ..rollout.trajectory import Trajectory
from ..sentinel import Sentinel
from .policies import policy_batches
from .update_batch import shard_by_groups, token_advantages_by_trajectory
from .checkpoints import CheckpointsAndExport
from .config import StarPOConfig
from .inference_engines import load_policy_into_engines, start_engines_for
from .rollout_scheduler import RolloutScheduler, validation_sample_seed
from .sentinel_actions import SentinelActions
from .weight_sync import RunnerWeights

logger = logging.getLogger(__name__)


class LearnerDiedError(RuntimeError):
    """A remote learner died; the algorithm cannot go on (resume from a checkpoint)."""


class StarPO(CheckpointsAndExport, RunnerWeights, Algorithm):
    """StarPO / StarPO-S: trajectory-level PPO or GRPO over whole multi-turn LLM-agent episodes."""

    @classmethod
    def get_default_config(cls) -> StarPOConfig:
        return StarPOConfig()

    @classmethod
    def resource_shortfall(cls, config: StarPOConfig, *, as_tune_trial: bool) -> str | None:
        """Why the Ray cluster cannot hold every actor ``config`` asks for (None: it can). Ray and Tune would
        wait for such actors forever, with no error; the driver calls this before it builds them. A Tune trial
        also reserves the main process's resources (the first bundle); a driver's own process reserves none. Ray
        starts here (as RLlib would, with this machine's resources) when it has not been started."""
        if not ray.is_initialized():
            ray.init()
        bundles = cls.default_resource_request(config).bundles[0 if as_tune_trial else 1 :]
        asked: dict[str, float] = {}
        for bundle in bundles:
            for name, amount in bundle.items():
                asked[name] = asked.get(name, 0.0) + amount
        have = ray.cluster_resources()
        if all(amount <= have.get(name, 0.0) + 1e-9 for name, amount in asked.items()):
            return None
        return (
            f"the run asks for {', '.join(f'{v:g} {k}' for k, v in asked.items())} "
            f"({'the trial itself, ' if as_tune_trial else ''}num_learners={config.num_learners} and "
            f"num_env_runners={config.num_env_runners} with their CPUs and GPUs each), and the Ray cluster has "
            f"{', '.join(f'{have.get(k, 0.0):g} {k}' for k in asked)}: lower num_learners, num_env_runners or "
            "their resources, or add nodes."
        )

    # Called with each phase's name as it starts ("sampling", "updating", ...): a main job shows it while an
    # iteration is long (rllib_ragen.jobs.callbacks.PhaseFile). None: nobody listens. A class default, not set in
    # setup(): RLlib calls on_algorithm_init, where a job sets it, inside Algorithm.setup.
    on_phase: Callable[[str], None] | None = None

    @override(Algorithm)
    def setup(self, config) -> None:
        if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
            # A Ray actor (a Tune trial): one torch thread per CPU it was given; more thrash beside other trials.
            torch.set_num_threads(max(1, int(config.num_cpus_for_main_process)))
        elif config.num_learners or config.num_env_runners:  # the driver builds remote actors: can they be placed?
            shortfall = self.resource_shortfall(config, as_tune_trial=False)
            if shortfall:
                raise ValueError(f"Cannot place StarPO's actors: {shortfall}")
        super().setup(config)
        self.rollouts = RolloutScheduler(self)  # the fan-out over env runners, seeds, the rollout in flight
        self.last_validation: list[Trajectory] = []
        self.last_rollout: list[Trajectory] = []
        # The last probed rollout's token advantages, by index in that rollout (kept episodes only).
        self.last_token_advantages: dict[int, list[float]] = {}
        self.engine_actors = start_engines_for(self) if config.inference_backend == "vllm" else None
        self._empty_filter_steps = 0  # iterations in a row whose rollout filter kept nothing
        # rae's running baseline per role, across iterations (objectives/role_baselines.py)
        self.role_baselines = RoleBaselines(config.rae_decay) if config.advantage_estimator == "rae" else None
        self._validation_time = [0.0, 0]  # this iteration's validations: seconds, count (time/validate_s)
        self.sentinel = Sentinel(config.sentinel_rules, config.sentinel_max_rollbacks)
        # An RLlib callback on each iteration's result, ahead of the user's (a job's outputs see its metrics).
        self.sentinel_actions = SentinelActions(self)
        self.callbacks = [self.sentinel_actions, *force_list(self.callbacks)]

    # ---- one iteration: rollout -> prepare -> update -> sync ----------------------------------------------------
    @override(Algorithm)
    def training_step(self) -> None:
        try:
            self._iterate()
        finally:  # every iteration's row says how much memory the run has needed so far
            self._log({M.PEAK_RSS: peak_rss_gib()})
            # The iteration's activations, KV caches and logits are freed; without a trim glibc keeps their pages, and
            # a SmolLM2 trial's resident memory grew by gigabytes over a run (docs/benchmarks.md).
            trim_heap()

    def _iterate(self) -> None:
        config, iteration = self.config, self.iteration
        self._validation_time = [0.0, 0]  # seconds and validations of this iteration (a job's time-left estimate)
        self._log({M.TIME_VALIDATE: 0.0, M.VALIDATIONS_IN_ITERATION: 0.0})
        if iteration == 0 and config.validate_before_training:  # whatever validation_interval says: a baseline
            self.announce_phase("validating before RL")
            self._validate(iteration)

        with self._timer(M.TIME_SAMPLE):
            trajectories, rollout_results, played_by = self.rollouts.training_rollout(iteration)
        self.last_rollout, self.last_token_advantages = trajectories, {}
        first_error = rollout_results.pop(M.FIRST_ENV_ERROR, None)
        if not trajectories:
            raise RuntimeError(self._every_episode_failed(iteration, rollout_results, first_error))
        self._log(rollout_results, ENV_RUNNER_RESULTS)
        self.metrics.log_value(
            (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME),
            rollout_results[M.NUM_ENV_STEPS_SAMPLED],
            reduce="lifetime_sum",
        )
        self._log(reply_diagnostics(trajectories))
        if config.separate_policies:  # each policy's replies apart too: its sentinel rules read its own
            for policy in config.trained_policy_ids():
                mine = reply_diagnostics([t for t in trajectories if t.policy_id == policy])
                self._log({M.policy_metric(policy, key): value for key, value in mine.items()})

        # policy id -> (its columns, its rows' trajectories' indices): one batch, or one per trained policy
        batches, update_metrics = policy_batches(
            trajectories,
            config,
            self._pad_token_id(),
            keep_ratio=self.sentinel.rollout_filter_ratio,
            role_baselines=self.role_baselines,
        )
        self._empty_filter_steps = 0 if batches else self._empty_filter_steps + 1
        update_metrics[M.FILTER_EMPTY_STEPS] = float(self._empty_filter_steps)
        self._log(update_metrics)
        if not batches:
            self._skip_update(iteration, played_by)
            return
        probe, gradient_norms = probe_schedule(
            iteration, config.collapse_diagnostics_interval, config.gradient_analysis_interval
        )
        if probe:
            with self._timer(M.TIME_COLLAPSE_PROBE):
                self._log(self._collapse_probe(batches, trajectories, gradient_norms))

        lag = iteration - played_by  # updates the learner made since the rollout's policy
        if not 0 <= lag <= config.max_policy_lag:
            raise RuntimeError(
                f"a rollout {lag} updates old reached the learner (max_policy_lag="
                f"{config.max_policy_lag}); this is a bug in StarPO's rollout scheduling."
            )
        self._log({M.POLICY_LAG: float(lag)})
        if config.max_policy_lag:  # the runners play the next rollout, on the pre-update weights, beside the update
            self.rollouts.start_next(iteration + 1)

        with self._timer(M.TIME_UPDATE):
            learner_results = self._update(batches, env_steps=int(rollout_results[M.NUM_ENV_STEPS_SAMPLED]))
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)

        if not config.max_policy_lag:  # off-policy: the next iteration syncs, once its rollout is in
            with self._timer(M.TIME_SYNC):
                self.sync_rollout_weights()
        if config.validation_interval and (iteration + 1) % config.validation_interval == 0:
            self.announce_phase("validating")
            self._validate(iteration + 1)

    def _skip_update(self, iteration: int, played_by: int) -> None:
        """The rollout filter kept no group: no update this iteration (the weights stay, so nothing to sync). The
        policy lag stays as it was, the next rollout is played as usual, and validation runs on schedule."""
        config = self.config
        logger.warning(
            "iteration %d: the rollout filter (%s) kept no group, so there is no update (%d such "
            "iterations in a row; %d end the run).",
            iteration,
            config.rollout_filter,
            self._empty_filter_steps,
            config.rollout_filter_empty_stop_steps,
        )
        self._log({M.POLICY_LAG: float(iteration - played_by)})
        if config.max_policy_lag:
            self.rollouts.start_next(iteration + 1)
        if config.validation_interval and (iteration + 1) % config.validation_interval == 0:
            self._validate(iteration + 1)

    @override(Algorithm)
    def restore_env_runners(self, env_runner_group):
        """RLlib's restore of dead env runners, which it runs before every iteration: not while the rollout thread
        uses them (that thread runs its own restores, through this method, when a runner dies mid-rollout)."""
        if getattr(self, "rollouts", None) is not None:
            self.rollouts.wait_outside_the_rollout_thread()
        return super().restore_env_runners(env_runner_group)

    def _collapse_probe(self, batches: dict, trajectories: list[Trajectory], gradient_norms: bool = True) -> dict:
        """The learner's echo-trap probe on this rollout, before its update (``collapse.py``): cross-scoring, the
        buckets' shares and, with ``gradient_norms``, their policy-gradient norms; of each separate policy on its own
        batch, under its name. With several learners the first one probes the whole batch (outside DDP's gradient
        sync)."""
        metrics, token_advantages = {}, {}
        for policy, (columns, indices) in batches.items():
            mine = [trajectories[i] for i in indices]
            pairs = cross_scoring_pairs(mine, self.config.collapse_subsample)
            found, advantages = self._on_first_learner(
                lambda learner: learner.collapse_probe(columns, pairs, gradient_norms=gradient_norms, module_id=policy)
            )
            by_index = token_advantages_by_trajectory(columns, advantages, mine)
            token_advantages.update({indices[i]: values for i, values in by_index.items()})
            if self.config.separate_policies:
                found = {M.policy_metric(policy, key): value for key, value in found.items()}
            metrics.update(found)
        self.last_token_advantages = token_advantages
        return metrics

    def _update(self, batches: dict, env_steps: int) -> list[dict]:
        """One learner-group update on the prepared batches (policy id -> (columns, indices)); with remote
        learners, one whole-group shard each."""
        self._check_learners_alive()
        try:
            return self._update_learners({policy: columns for policy, (columns, _) in batches.items()}, env_steps)
        except ray.exceptions.RayActorError as error:
            self._check_learners_alive(error)
            raise

    def _on_first_learner(self, func):
        """``func(learner)`` on the local learner or the first healthy remote one; its return value."""
        # LearnerGroup (Ray 2.60) names its learner actors' health, and its local learner, on private fields only;
        # no upstream issue asks for accessors (ray-project/ray searched 2026-12-06). Here and below.
        first = None if self.learner_group.is_local else self.learner_group._worker_manager.healthy_actor_ids()[:1]
        return next(iter(self.learner_group.foreach_learner(func, remote_actor_ids=first))).get()

    def _check_learners_alive(self, cause: BaseException | None = None) -> None:
        """Raise :class:`LearnerDiedError` once any remote learner is gone.

        RLlib does not restart learners, and after one dies its ``LearnerGroup`` updates the survivors only (none:
        silently nothing) and fails later with an ``IndexError``; a dead learner also takes its optimizer state.
        """
        if self.learner_group.is_local:
            return
        manager = self.learner_group._worker_manager  # private: see _on_first_learner
        dead = sorted(set(manager.actor_ids()) - set(manager.healthy_actor_ids()))
        if dead:
            why = str(cause).splitlines()[0] if cause is not None else "found dead before the update"
            raise LearnerDiedError(
                f"remote learner(s) {dead} of {manager.num_actors()} died ({why})"
                ". RLlib does not restart learners and their optimizer state died with them, so this algorithm "
                "cannot train on. Stop it and resume from the last checkpoint: StarPO.from_checkpoint(path), or "
                "a main job's --resume."
            ) from cause

    def _update_learners(self, columns: dict[str, dict[str, np.ndarray]], env_steps: int) -> list[dict]:
        lifetime = {
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME))
        }
        if self.config.num_learners > 1:  # one policy (validate() refuses separate ones): a shard per learner
            shards = [
                {DEFAULT_MODULE_ID: shard}
                for shard in shard_by_groups(columns[DEFAULT_MODULE_ID], self.config.num_learners)
            ]
        else:
            shards = [columns]
        batches = [
            MultiAgentBatch({policy: SampleBatch(part) for policy, part in shard.items()}, env_steps=env_steps)
            for shard in shards
        ]
        if len(batches) == 1:
            return self.learner_group.update(batch=batches[0], timesteps=lifetime)
        return self.learner_group.update(batches=batches, timesteps=lifetime)

    def evaluate_validation_set(self) -> dict[str, float]:
        """Play the validation set now, outside the schedule (e.g. after a last iteration that did not validate);
        returns its metrics, which are also logged like the scheduled ones."""
        return self._validate(self.iteration)

    def play_validation_states(self, temperature: float) -> list[Trajectory]:
        """The fixed validation states played by the current policy at ``temperature`` (0: greedy), with the
        validation's sampling seed; nothing is logged. The main jobs pair greedy outcomes before and after RL."""
        config = self.config
        self.announce_phase("playing the validation states " + (f"at T={temperature:g}" if temperature else "greedily"))
        self.rollouts.runners_on_current_weights()
        sampling = dataclasses.replace(config.sampling_params(validation=True), temperature=float(temperature))
        trajectories, _ = self.rollouts.play(
            config.validation_starts(), config.validation_group_size, sampling, validation_sample_seed(config)
        )
        return trajectories

    @staticmethod
    def play_validation_states_with(
        config,
        policy,
        tokenizer=None,
        *,
        temperature: float = 0.0,
        env_name: str | None = None,
        device: str = "cpu",
        progress: Callable[[int, int], None] | None = None,
    ) -> list[Trajectory]:
        """The validation states of ``env_name`` (None: all) played without a built algorithm, in the agent's own
        loop (prompts, budgets, transition seeds, sampling seed, as many episodes per state as validation plays),
        by ``policy``: a scripted one (prompt text -> reply), the baselines a job pairs its agent against; a model
        as it is, at ``temperature`` with the validation's settings (the warm start's validation curve); or a saved
        model's folder, loaded in the config's dtype with its own tokenizer onto ``device``
        (``rllib_ragen.jobs.evaluate``).
        ``tokenizer``: the policy model's (None: the config's model's, or the folder's). ``progress``: called after
        every turn with the episodes ended and played."""
        from ..rollout.backends import ScriptedBackend
        from ..rollout.engine import RolloutEngine
        from ..rollout.models import load_policy
        from .inference_engines import make_backend

        if isinstance(policy, (str, os.PathLike)):
            policy, tokenizer = load_policy(str(policy), dtype=config.sampling_dtype)
            policy = policy.to(device)
        tokenizer = tokenizer or config.policy_tokenizer()
        if isinstance(policy, torch.nn.Module):  # a fresh backend: the weights may have changed in place
            backend = make_backend("hf", policy, tokenizer, config)
        else:
            backend = ScriptedBackend(policy, tokenizer)
        starts = [
            s for s in config.validation_starts() if env_name is None or not isinstance(s, tuple) or s[0] == env_name
        ]
        sampling = dataclasses.replace(config.sampling_params(validation=True), temperature=float(temperature))
        trajectories, _ = RolloutEngine(config.rollout_config(), backend, tokenizer).rollout(
            starts,
            config.validation_group_size,
            sampling,
            sample_seed=validation_sample_seed(config),
            progress=progress,
        )
        return trajectories

    def _validate(self, iteration: int) -> dict[str, float]:
        """Play the fixed validation set at the validation temperature; metrics under ``evaluation/env_runners``."""
        config, start = self.config, time.perf_counter()
        self.rollouts.runners_on_current_weights()
        sampling = config.sampling_params(validation=True)
        trajectories, results = self.rollouts.play(
            config.validation_starts(), config.validation_group_size, sampling, validation_sample_seed(config)
        )
        results.pop(M.FIRST_ENV_ERROR, None)  # counted in the results; its log line has it
        self.last_validation = trajectories
        results[M.VALIDATION_ITERATION] = float(iteration)
        self._log(results, EVALUATION_RESULTS, ENV_RUNNER_RESULTS)
        # RLlib's hook after an evaluation: callbacks (the job's outputs) see each validation as it happens.
        make_callback(
            "on_evaluate_end",
            callbacks_objects=self.callbacks,
            callbacks_functions=config.callbacks_on_evaluate_end,
            kwargs=dict(algorithm=self, metrics_logger=self.metrics, evaluation_metrics=results),
        )
        spent = self._validation_time
        spent[:] = [spent[0] + time.perf_counter() - start, spent[1] + 1]
        self._log({M.TIME_VALIDATE: spent[0], M.VALIDATIONS_IN_ITERATION: float(spent[1])})
        return results

    # ---- after each iteration: RAGEN's early stop; the sentinel is a callback (sentinel_actions.py) ---------------
    @override(Algorithm)
    def step(self) -> dict:
        result = super().step()
        self._stop_when_nothing_is_kept(result)
        return result

    def _stop_when_nothing_is_kept(self, result: dict) -> None:
        """RAGEN's early stop: ``rollout_filter_empty_stop_steps`` iterations in a row with no group kept."""
        if self._empty_filter_steps >= self.config.rollout_filter_empty_stop_steps:
            logger.warning(
                "the rollout filter kept no group in %d iterations in a row: stopping the run (the policy "
                "has no reward variance left to learn from; rollout_filter_empty_stop_steps).",
                self._empty_filter_steps,
            )
            result["done"] = True

    def sync_rollout_weights(self) -> None:
        """The learner's current policy to whatever plays the rollouts (after an update, a restore or a rollback)."""
        if self.engine_actors is not None:
            # Env runners only route prompts to the engines: the new weights go to the engines alone.
            self._log({M.TIME_WEIGHT_LOAD: load_policy_into_engines(self)})
        else:
            self._check_learners_alive()
            self._send_policy_to_env_runners()

    @override(Algorithm)
    def cleanup(self) -> None:
        if getattr(self, "rollouts", None) is not None:
            self.rollouts.shutdown()
        if getattr(self, "engine_actors", None) is not None:
            self.engine_actors.shutdown()
            self.engine_actors = None
        if getattr(self, "sentinel_actions", None) is not None:
            self.sentinel_actions.cleanup()
        super().cleanup()

    # ---- helpers ---------------------------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        """The rollout's tokenizer (the local env runner's, else the first remote one's)."""
        if self.env_runner is not None:
            return self.env_runner.tokenizer
        if getattr(self, "_remote_tokenizer", None) is None:
            self._remote_tokenizer = self.env_runner_group.foreach_env_runner(
                lambda r: r.tokenizer, local_env_runner=False
            )[0]
        return self._remote_tokenizer

    def _pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def _every_episode_failed(self, iteration: int, results: dict, first_error: str | None) -> str:
        """Why a training rollout of iteration ``iteration`` brought back no trajectory: the counts, the first failed
        environment call (its type and message), and the curriculum stage the rollout played."""
        config = self.config
        counted = ", ".join(
            f"{int(results[key])} {key.split('/')[-1].replace('_', ' ')}"
            for key in (M.ENV_ERRORS, M.ENV_TIMEOUTS, M.NONFINITE_REWARDS, M.PROMPTS_TOO_LONG)
            if results.get(key)
        )
        where = config.env_name
        if config.curriculum:
            stage = config.curriculum_stage(iteration)
            if stage < len(config.curriculum):
                where += (
                    f" in curriculum stage {stage + 1} of {len(config.curriculum)} (curriculum[{stage}], "
                    f"env_config {config.training_env_config(iteration)})"
                )
        return (
            f"every episode of iteration {iteration + 1}'s training rollout of {where} failed"
            + (f" ({counted})" if counted else "")
            + (f"; the first: {first_error.rstrip('.')}" if first_error else "")
            + ". The env runner logs have each one."
        )

    def _log(self, metrics: dict[str, float], *path: str) -> None:
        """Log each value as the latest of its kind, under ``path`` (e.g. ``env_runners``) in the result."""
        for key, value in metrics.items():
            self.metrics.log_value((*path, key), value, window=1)

    def announce_phase(self, phase: str) -> None:
        """Tell :attr:`on_phase` (if set) that ``phase`` starts now."""
        if self.on_phase is not None:
            self.on_phase(phase)

    @contextlib.contextmanager
    def _timer(self, name: str):
        """Time a block into the top-level metric ``name`` (seconds of this iteration), announced as a phase."""
        self.announce_phase(PHASES.get(name, name))
        with self.metrics.log_time(name, reduce="mean", window=1):  # window 1: this iteration's, as _log's values
            yield


PHASES = {
    M.TIME_SAMPLE: "sampling",
    M.TIME_COLLAPSE_PROBE: "probing for the echo trap",
    M.TIME_UPDATE: "updating",
    M.TIME_SYNC: "sending the weights to the runners",
}  # each timed block's name as a phase
