"""The job's outputs, written by an RLlib callback into the trial's own folder; its TensorBoard logs, by a Tune one.

Any StarPO algorithm that carries :class:`JobOutputs` (``config.callbacks(...)``) writes, while it trains, what a person
needs to judge the run: the machine it ran on, the validation episodes before RL and after the last iteration (sampled
and greedy), a sample of training episodes with their token advantages at every probe iteration, the sentinel's firings,
and the trained policy (``policy/``, loadable by plain transformers). The report writes the viewer from them. A main
job, every trial of a Tune sweep and a cluster run get them alike, because the trial writes them itself.

The folder is the trial's folder in Tune's ``storage_path`` when that is a local path (a cluster's shared disk
too), so that a restored trial appends to what its earlier session wrote; otherwise the trial's working
directory, which Tune copies to the storage with ``SyncConfig(sync_artifacts=True)``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import os
import pathlib
import platform
import sys
import time

import torch

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.tune.logger import TBXLoggerCallback
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, EVALUATION_RESULTS

from .. import metrics as M
from ..hardware import peak_rss_gib
from .storage import is_local_storage
from .outputs import (
    BEFORE_RL,
    PHASE_FILE,
    read_run_json,
    AFTER_GREEDY_ROLLOUTS,
    AFTER_ROLLOUTS,
    BEFORE_GREEDY_ROLLOUTS,
    BEFORE_ROLLOUTS,
    LEAGUE,
    MACHINE,
    POLICY,
    SENTINEL_FILE,
    TRAINING_ROLLOUTS,
    write_rollouts,
)
from ..files import write_text_atomically

logger = logging.getLogger(__name__)

NEXT_TRAINING_SEED = "job/next_training_seed"  # which training states the run has shown so far (validation splits)
# In result["job"] (progress.csv: job/time_budget_stop): 1.0 when the time budget (max_minutes) ended the trial.
TIME_BUDGET_STOP = "time_budget_stop"
MACHINE_PACKAGES = ("torch", "transformers", "tokenizers", "ray", "numpy")


def machine_record() -> dict:
    """What a run's numbers depend on besides its code, settings and seeds: the same commit gives another model
    after hundreds of steps where float kernels round differently (another CPU instruction set, a GPU), so each
    trial records where it ran."""
    cpu = platform.processor() or platform.machine()
    try:  # Linux names the CPU model here; platform.processor() often gives only the architecture
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    packages = {}
    for name in MACHINE_PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "cpu": cpu,
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "python": platform.python_version(),
        "platform": sys.platform,
        "packages": packages,
    }


def record_machine(folder: pathlib.Path) -> None:
    """Add this session's machine to the trial's ``machine.json`` (a list: a resumed trial may run elsewhere)."""
    path, record = folder / MACHINE, machine_record()
    sessions = read_run_json(path, [])
    if not sessions or sessions[-1] != record:
        write_text_atomically(path, json.dumps([*sessions, record], indent=1))


class PhaseFile:
    """The trial's ``phase.json``: the phase it is in (``StarPO.on_phase``), its iteration and since when, rewritten
    whole as each phase starts (a few small writes an iteration). The job's console reads it to say what a long
    iteration is doing; after a crash it says where the trial was. Once :attr:`ending` is set, phases belong to the
    trial's ending, after its last iteration."""

    def __init__(self, algorithm, path: pathlib.Path):
        self.algorithm, self.path = algorithm, path
        self.ending, self.failed = False, False

    def __call__(self, phase: str) -> None:
        # algorithm.iteration counts the finished iterations: a phase within one belongs to the next.
        record = {"phase": phase, "iteration": int(self.algorithm.iteration) + (not self.ending), "since": time.time()}
        if self.ending:
            record["ending"] = True
        try:
            write_text_atomically(self.path, json.dumps(record))
        except OSError as error:  # a full disk: said once (the trial's log); the run's own records matter more
            if not self.failed:
                self.failed = True
                logger.warning(
                    "the trial's phase file %s cannot be written (%s); the console will not say what a "
                    "quiet trial is doing",
                    self.path,
                    error,
                )


def trial_folder(algorithm) -> pathlib.Path:
    """Where the trial's outputs go: its folder in a local ``storage_path``, else its working directory (an
    algorithm built outside Tune: its ``logdir``)."""
    storage = getattr(algorithm, "_storage", None)  # Tune's StorageContext of this trial; None outside Tune
    if storage is not None and is_local_storage(storage.storage_filesystem):
        folder = pathlib.Path(storage.trial_fs_path)
    else:
        folder = pathlib.Path(algorithm.logdir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def out_of_time(result: dict, budget_s: float, ending_s: float) -> bool:
    """Whether a trial with this iteration's ``result`` must end now to stay within ``budget_s`` seconds of
    training (Tune's ``time_total_s``, which a restored trial carries on): the next iteration is expected to take
    as long as this one did without its validations, and ending takes ``ending_s`` (a validation and the greedy
    play; unknown, 0, until the trial has validated in this session: then the iteration's own time stands in)."""
    own_s = float(result["time_this_iter_s"]) - float(result.get(M.TIME_VALIDATE, 0.0))
    return float(result["time_total_s"]) + own_s + (ending_s or own_s) > budget_s


class JobOutputs(RLlibCallback):
    """Writes a main job's outputs into the trial folder (see the module docstring).

    Args:
        iterations: the iteration the job stops at; after it the trained policy is validated (unless that
            iteration validated already), played greedily and exported. A run the sentinel
            stops (``result["done"]``) ends the same way.
        max_minutes: the trial's time budget (0: none): the trial ends the same way, earlier, after the first
            iteration past which one more iteration and that ending would not fit (:func:`out_of_time`); its result
            then says so (``job/time_budget_stop``).
        training_sample: episodes the rollout filter left out, kept beside the trained ones in the training sample.
    """

    def __init__(self, iterations: int, max_minutes: float = 0.0, training_sample: int = 8):
        super().__init__()
        self.iterations, self.max_minutes, self.training_sample = iterations, max_minutes, training_sample
        self._before: dict | None = None
        # What ending the trial costs, as measured in this session: the most any iteration spent validating (the
        # first one's "before RL" validation includes the greedy play an ending also does).
        self._ending_s = 0.0

    def on_algorithm_init(self, *, algorithm, **kwargs) -> None:
        record_machine(trial_folder(algorithm))
        algorithm.on_phase = PhaseFile(algorithm, trial_folder(algorithm) / PHASE_FILE)

    def on_evaluate_end(self, *, algorithm, evaluation_metrics: dict, **kwargs) -> None:
        folder, iteration = trial_folder(algorithm), int(evaluation_metrics[M.VALIDATION_ITERATION])
        if iteration == 0:  # before any update: kept for the paired comparison, greedy too
            self._before = dict(evaluation_metrics)
            write_rollouts(folder / BEFORE_ROLLOUTS, algorithm.last_validation, algorithm.tokenizer)
            write_rollouts(folder / BEFORE_GREEDY_ROLLOUTS, algorithm.play_validation_states(0.0), algorithm.tokenizer)
        else:  # the latest validation; after the last iteration, the trained policy's
            write_rollouts(folder / AFTER_ROLLOUTS, algorithm.last_validation, algorithm.tokenizer, iteration=iteration)

    def on_train_result(self, *, algorithm, result: dict, **kwargs) -> None:
        folder, iteration = trial_folder(algorithm), algorithm.iteration
        if self._before is not None:  # the first result carries it: a later validation in the same iteration
            result[BEFORE_RL] = {ENV_RUNNER_RESULTS: self._before}  # replaces it under "evaluation"
            self._before = None
        result.setdefault("job", {})["next_training_seed"] = algorithm.rollouts.seed_schedule.next_train
        result["job"][TIME_BUDGET_STOP] = 0.0  # in every result: progress.csv keeps the first result's columns
        if algorithm.last_token_advantages:  # the probe ran: one file per iteration, so a replayed one replaces it
            self._write_training_sample(algorithm, folder / TRAINING_ROLLOUTS / f"iteration_{iteration:06d}.parquet")
        if algorithm.sentinel.rules:
            write_text_atomically(
                folder / SENTINEL_FILE,
                json.dumps([dataclasses.asdict(f) for f in algorithm.sentinel.firings], indent=2),
            )
        self._ending_s = max(self._ending_s, float(result.get(M.TIME_VALIDATE, 0.0)))
        if (
            self.max_minutes
            and iteration < self.iterations
            and not result.get("done")
            and out_of_time(result, self.max_minutes * 60, self._ending_s)
        ):
            result["done"] = True  # ends the Tune trial, as the sentinel's stop does
            result["job"][TIME_BUDGET_STOP] = 1.0
        if iteration >= self.iterations or result.get("done"):
            self._finish(algorithm, folder, result)

    def _finish(self, algorithm, folder: pathlib.Path, result: dict) -> None:
        """The trained policy: validated (this result shows it), played greedily and exported."""
        validation = result.get(EVALUATION_RESULTS, {}).get(ENV_RUNNER_RESULTS, {})
        if isinstance(algorithm.on_phase, PhaseFile):
            algorithm.on_phase.ending = True
        if validation.get(M.VALIDATION_ITERATION) != algorithm.iteration:
            algorithm.announce_phase("validating the trained policy")
            metrics = algorithm.evaluate_validation_set()
            result.setdefault(EVALUATION_RESULTS, {})[ENV_RUNNER_RESULTS] = metrics
        write_rollouts(
            folder / AFTER_GREEDY_ROLLOUTS,
            algorithm.play_validation_states(0.0),
            algorithm.tokenizer,
            iteration=algorithm.iteration,
        )
        algorithm.announce_phase("exporting the trained policy")
        algorithm.export_pretrained(folder / POLICY)
        algorithm.export_league(folder / LEAGUE)  # what a rating table across the league plays (jobs.matches)
        result[M.PEAK_RSS] = peak_rss_gib()  # the closing validations and the export can set the trial's peak

    def _write_training_sample(self, algorithm, path: pathlib.Path) -> None:
        """This iteration's trained episodes (with their token advantages) and a few the rollout filter left out."""
        advantages = algorithm.last_token_advantages
        left_out = [i for i in range(len(algorithm.last_rollout)) if i not in advantages][: self.training_sample]
        chosen = sorted([*advantages, *left_out])
        path.parent.mkdir(exist_ok=True)
        write_rollouts(
            path,
            [algorithm.last_rollout[i] for i in chosen],
            algorithm.tokenizer,
            iteration=algorithm.iteration,
            advantages={new: advantages[old] for new, old in enumerate(chosen) if old in advantages},
        )


TENSORBOARD = "tensorboard"  # <output_dir>/tensorboard/<run>/<trial>: one TensorBoard run per trial


class TensorBoardLogs(TBXLoggerCallback):
    """Tune's TensorBoard logger, writing each trial's events to ``<output_dir>/tensorboard/<run>/<trial>`` instead of
    the trial folder. TensorBoard follows folder links, so in the run folders, which ``<output_dir>/latest`` links
    to, every run would be listed twice (``tensorboard --logdir outputs/``)."""

    def __init__(self, folder: pathlib.Path):
        super().__init__()
        self.folder = pathlib.Path(folder)

    def log_trial_start(self, trial) -> None:
        # TBXLoggerCallback (Ray 2.60) takes no folder of its own: its per-trial writers are private fields, set here
        # as its own log_trial_start sets them (no upstream issue asks for a folder; searched 2026-12-06).
        if trial in self._trial_writer:
            self._trial_writer[trial].close()
        path = self.folder / pathlib.Path(trial.local_path).name
        path.mkdir(parents=True, exist_ok=True)
        self._trial_writer[trial] = self._summary_writer_cls(str(path), flush_secs=30)
        self._trial_result[trial] = {}
