"""The main-job driver behind ``tuned_examples/``: a warm start, a Tune experiment of StarPO, and the report.

A job file defines its ``StarPOConfig`` and its :class:`JobSettings` (output folder, iterations, warm start, pass
bar); :func:`parse_job_args` lays the command-line flags over both; :func:`run_job` then

1. warm-starts the policy on demonstrations, once per distinct set of warm-start settings: the model is cached
   under ``<output_dir>/warm_starts/<key>/``, so seeds, sweep trials and a resumed job share it;
2. runs ``tune.Tuner(StarPO, ...)`` with one trial per seed (``--seeds``) and grid point (``--grid``), each in
   its own folder, stopped at ``iterations``, checkpointed every ``checkpoint_interval`` iterations, restarted
   from its last checkpoint after a failure up to ``max_failures`` times; the trials write their outputs
   themselves (:class:`~rllib_ragen.jobs.callbacks.JobOutputs`), and Tune writes the metrics (``progress.csv``,
   ``result.json``; TensorBoard events beside the run folders, ``<output_dir>/tensorboard/<run>/<trial>``);
3. builds the report from the finished folders (:mod:`rllib_ragen.jobs.report`): ``summary.json``, the learning
   curve and the final table.

The run folder is Tune's experiment folder, ``<output_dir>/<run_name>/`` (default ``<timestamp>_seed<seed>``),
with ``<output_dir>/latest`` pointing at the newest: ``tune.ExperimentAnalysis`` opens it, ``Tuner.restore``
continues it (``--resume``), and ``tensorboard --logdir <output_dir>`` shows each trial once.

Example::

    config = StarPOConfig().environment("rllib_ragen/Bandit-v0").training(validation_interval=10)
    config, job = parse_job_args(config, JobSettings(output_dir="outputs/bandit", iterations=10))
    run_job(config, job, demonstration_policy=random_arm_policy(seed=0))
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import pathlib
import re
import signal
import sys
import threading
import time
from typing import Callable

import torch

from .callbacks import TENSORBOARD, JobOutputs, TensorBoardLogs
from .flags import parse_job_args, user_model_config
from .settings import JobSettings
from .outputs import BASELINES, baseline_file, start_run_folder, write_rollouts
from .console import JobConsole, close_run_log, keep_notices_off_the_console, print_plan, send_notices_to
from ..files import write_text_atomically
from .report import report_experiment
from .readers import headline_environment
from ..sentinel import echo_trap_rules
from ..starpo.presets import PRESET_LABEL, VARIANT_LABEL
from .storage import run_storage
from .warm_start import cached_warm_start

__all__ = ["JobSettings", "parse_job_args", "run_job"]


def run_job(
    config,
    job: JobSettings,
    demonstration_policy: Callable[[str], str] | None = None,
    known_scores: dict[str, float] | None = None,
    baselines: dict[str, Callable[[str], str]] | None = None,
) -> dict:
    """Warm start (when a demonstration policy is given), train as a Tune experiment, report. Returns the summary:
    the trial's with one trial, else ``{"trials": {name: summary}, "spread": ...}``.

    Validation runs before training and every ``validation_interval`` iterations, as the config says, and once
    more after the last iteration when that one did not validate, so "after" is always the trained policy. The
    verdict against ``job.pass_bar`` (the least rise of validation success over the warm start that counts as
    learning) is printed and stored in the summary (``success_gain``, ``passed``). ``known_scores`` (e.g.
    ``{"random policy": 0.22}``) are drawn on the success panel. ``baselines`` (name: a scripted policy, prompt
    text -> reply) are played on the headline environment's validation states before RL, and each trial's greedy
    agent is paired against each before and after RL (``summary.json``'s ``baselines``). Raises RuntimeError,
    after writing the report of what finished, when a trial failed.
    """
    job.validate(config)
    files = [baseline_file(name) for name in baselines or {}]  # before any work: each baseline needs its own file
    if len(set(files)) < len(files):
        raise ValueError(
            f"baselines {sorted(baselines)} would share a file ({files}): give them names that differ "
            "in their letters or digits."
        )
    if set(baselines or {}) & set(known_scores or {}):  # the curve draws both by name: one would hide the other
        raise ValueError(
            f"{sorted(set(baselines) & set(known_scores))} names both a baseline and a known score line; rename one."
        )
    if not job.verbose:
        keep_notices_off_the_console()
    if not config.sentinel_rules and job.sentinel != "off":  # custom rules (--sentinel-rules) replace the built-in
        # As plain data: Tune's params.json then holds the rules themselves, not their repr, so the trial's settings
        # read back whole (python -m rllib_ragen.jobs.evaluate validates them).
        rules = [dataclasses.asdict(rule) for rule in echo_trap_rules(job.sentinel)]
        config = config.copy(copy_frozen=False).training(sentinel_rules=rules)
    out = claim_run_folder(job, config.seed or 0)
    start_run_folder(out, config, job)
    try:
        return _run(config, job, demonstration_policy, out, known_scores or {}, baselines or {})
    finally:
        close_run_log()


def claim_run_folder(job: JobSettings, seed: int) -> pathlib.Path:
    """The run's folder (``job.validate`` checked the paths): for ``resume`` the run to continue; else a new
    folder, created here at once (``mkdir`` is atomic), so that two jobs started together with the same name never
    share one: the second is refused, or with the default name gets the next free one."""
    if job.resume:
        return job.run_folder()
    base = pathlib.Path(job.output_dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    if job.run_name:
        try:
            (base / job.run_name).mkdir()
        except FileExistsError:
            raise FileExistsError(
                f"{base / job.run_name} holds an earlier run. Continue it with --resume, or "
                "choose another --run-name. Nothing was overwritten."
            ) from None
        return base / job.run_name
    stamp, n = time.strftime("%Y%m%d-%H%M%S"), 1
    while True:
        out = base / (f"{stamp}_seed{seed}" + (f"-{n}" if n > 1 else ""))
        try:
            out.mkdir()
            return out
        except FileExistsError:  # a job started in the same second
            n += 1


def thread_counts(job: JobSettings, cpus: int, trials: int) -> tuple[int, int]:
    """Torch threads of the warm start and of each trial: ``job.threads`` for both when set; else the warm start,
    which runs alone before the trials, takes every CPU, and the trials share them."""
    cpus = max(1, cpus)
    return job.threads or cpus, job.threads or max(1, cpus // trials)


def start_ray(verbose: bool) -> None:
    """Start a local Ray for a job, unless one runs. Ray's token authentication stays as Ray sets it (on by default
    since Ray 2.60: a token in ``~/.ray/auth_token``), because Ray's processes listen on the machine's network
    interfaces while the job runs and would run code for anyone who reaches their ports. ``RAY_AUTH_MODE=disabled``
    set by the user still opts out."""
    import ray

    if not ray.is_initialized():
        ray.init(
            include_dashboard=False, log_to_driver=verbose, **({} if verbose else {"logging_level": logging.ERROR})
        )
        if not verbose:
            keep_notices_off_the_console()  # ray.init set up its console handler again


def _run(
    config, job: JobSettings, demonstration_policy, out: pathlib.Path, known_scores: dict, baselines: dict
) -> dict:
    import ray
    from ray import tune

    from ..starpo import StarPO

    if not job.verbose:
        send_notices_to(out / "job.log")
    start_ray(job.verbose)
    shortfall = StarPO.resource_shortfall(config, as_tune_trial=True)  # Tune would leave such a trial pending forever
    if shortfall:
        raise ValueError(f"No trial can start: {shortfall}")
    seeds, grid = job.seed_list(config), job.grid or {}
    trials = len(seeds) * math.prod(len(values) for values in grid.values())
    warm_start_threads, threads = thread_counts(job, int(ray.available_resources().get("CPU", 1)), trials)
    print_plan(config, job, out, demonstration_policy is not None, trials)

    if demonstration_policy is not None and job.warm_start_steps > 0 and job.warm_start_episodes > 0:
        torch.set_num_threads(warm_start_threads)
        model = cached_warm_start(config, job, demonstration_policy)
        config = config.copy(copy_frozen=False).rl_module(model_config={**user_model_config(config), "model": model})
    torch.set_num_threads(threads)
    headline = headline_environment(config)
    config = (
        config.copy(copy_frozen=False)
        .resources(num_cpus_for_main_process=threads)
        .callbacks(
            [
                *_as_list(config.callbacks_class),
                functools.partial(JobOutputs, iterations=job.iterations, max_minutes=job.max_minutes),
            ]
        )
    )
    if baselines and not job.resume:  # played first (seconds): a baseline that cannot play the states fails now
        _play_baselines(config, baselines, out / BASELINES, headline.name)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's banner and trial table: JobConsole prints instead
    console = JobConsole(
        job.iterations, config.validation_interval, config.env_name, headline.name, trials, job.max_minutes
    )
    if job.resume:
        tuner = restore_tuner(out)
        print(f"resuming {out}: every unfinished trial continues from its last checkpoint", flush=True)
    else:
        tuner = tune.Tuner(
            StarPO,
            param_space=_param_space(config, seeds, grid),
            run_config=tune.RunConfig(
                name=out.name,
                storage_path=str(out.parent),
                stop={"training_iteration": job.iterations},
                storage_filesystem=run_storage(),  # every file Tune copies into the run folder whole or absent
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=job.checkpoint_interval, checkpoint_at_end=job.checkpoint_interval > 0
                ),
                failure_config=tune.FailureConfig(max_failures=job.max_failures),
                sync_config=tune.SyncConfig(sync_artifacts=True),  # outputs of trials whose storage is not local
                callbacks=[console, TensorBoardLogs(out.parent / TENSORBOARD / out.name)],
                verbose=0,
            ),
            tune_config=tune.TuneConfig(trial_dirname_creator=functools.partial(trial_dirname, list(grid))),
        )
    with sigterm_as_ctrl_c() as sigterms:
        with restored_without_stale_decisions():
            results = tuner.fit()
        sigterms.forward = False
        return _after_fit(results, console, job, out, known_scores, sigterms)


def _after_fit(
    results, console, job: JobSettings, out: pathlib.Path, known_scores: dict, sigterms: SigtermsSeen
) -> dict:
    """What a job does once Tune is done: it says why a trial failed or was cut, else reports the run."""
    # A trial's cause as the console read it from Tune's local copy of error.txt (the run folder's copy may be
    # missing: a full disk), else from the result grid.
    causes = {
        pathlib.Path(r.path).name: console.errors.get(pathlib.Path(r.path).name)
        or (str(r.error).strip().splitlines() or ["(no message)"])[-1]
        for r in results
        if r.error or pathlib.Path(r.path).name in console.errors
    }
    # Tune ends fit() early on Ctrl-C (SIGINT) or SIGUSR1 and returns as if done: a trial short of its iterations
    # that neither failed nor was stopped by the run itself (result "done": the sentinel, the empty filter) was cut.
    cut = [
        r
        for r in results
        if pathlib.Path(r.path).name not in causes
        and not (r.metrics or {}).get("done")
        and int((r.metrics or {}).get("training_iteration", 0)) < job.iterations
    ]
    if cut:
        print(f"outputs: {out}")
        raise RunInterrupted(
            f"the run was interrupted before its {job.iterations} iterations: "
            + "; ".join(
                f"{pathlib.Path(r.path).name} after {int((r.metrics or {}).get('training_iteration', 0))}" for r in cut
            )
            + f". No final table was made (it would compare the warm start with itself). Continue with: "
            f"{' '.join(_resume_command(out))}"
        )
    unreported = None
    try:
        report = report_experiment(out, job.pass_bar, known_scores, allow_imports=True, output=out)  # its own run
    except OSError as error:  # no trial got a result (FileNotFoundError), or the disk is full
        if not causes:
            raise
        report, unreported = {"trials": {}}, error  # the failure below says why; the report's own error beside it
    print(f"outputs: {out}")
    if causes:
        full = any("No space left on device" in cause or "Errno 28" in cause for cause in causes.values())
        raise RuntimeError(
            f"{len(causes)} of {len(results)} trials failed: "
            + "; ".join(f"{out / name}: {cause}" for name, cause in causes.items())
            + " (the whole traceback: error.txt in the trial's folder, when it could be written)."
            + (f" The report could not be written either ({unreported})." if unreported else "")
            + (
                f" The disk holding {out} is full: what was written before it filled is whole (results, "
                "checkpoints, the run's state); free space there, then continue"
                if full
                else " Continue"
            )
            + f" from each trial's last checkpoint with: {' '.join(_resume_command(out))}"
        )
    if sigterms.received:  # it came once the trials had finished their iterations, closing included
        print(
            f"SIGTERM arrived after the trials had finished their iterations (during their closing validation and "
            f"export, or the report); the run above is whole. Exiting with {128 + signal.SIGTERM}, as a job "
            "stopped by SIGTERM does.",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + signal.SIGTERM)
    return next(iter(report["trials"].values())) if len(report["trials"]) == 1 else report


class SigtermsSeen:
    """The SIGTERMs a job received (``sigterm_as_ctrl_c``); ``forward``: whether one still interrupts Tune."""

    def __init__(self):
        self.received, self.forward = 0, True


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """From Tune's start to the job's end: SIGTERM (a scheduler's stop, ``kill``) ends the run the way Ctrl-C does,
    through Tune's own interrupt, which saves the experiment state; the job then says it was interrupted and how to
    resume. Without this, the SIGTERM handler Ray's core worker installs in the driver printed a C++ stack trace and
    aborted (exit -6). Once Tune is done (``forward`` off) a SIGTERM is only counted: what is left, the report, takes
    seconds, and the job then says it came. In the main thread only (signals are delivered there)."""
    seen = SigtermsSeen()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def to_ctrl_c(signum, frame):
        seen.received += 1
        if seen.forward:
            signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, to_ctrl_c)
    try:
        yield seen
    finally:  # (None: the previous handler was not Python's, and cannot be put back from here)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def restored_without_stale_decisions():
    """While Tune runs: a restored run starts without the per-trial decisions Tune had pending when the state was
    saved. Tune 2.60 saves them with the experiment state and restores them on resume, although no trial of the
    old session is running then; a STOP cached while a trial's checkpoint failed (a full disk) stopped the resumed
    trial after its first checkpoint, short of its iterations, as if interrupted. No upstream issue names this
    (ray-project/ray searched 2026-12-06); the nearest, ray-project/ray#64685 and #64548, clear a stale queued
    decision when a trial pauses, not on restore. Drop this once Tune's ``__setstate__`` leaves them out."""
    from ray.tune.execution.tune_controller import TuneController

    original = TuneController.__setstate__

    def setstate(controller, state):
        original(controller, {**state, "_cached_trial_decisions": {}, "_queued_trial_decisions": {}})

    TuneController.__setstate__ = setstate
    try:
        yield
    finally:
        TuneController.__setstate__ = original


def restore_tuner(out: pathlib.Path):
    """Tune's ``Tuner.restore`` of a run folder, its errored trials included; a ``tuner.pkl`` that cannot be
    unpickled (cut by a full disk or a kill) is named instead of failing deep inside Tune."""
    from ray import tune

    from ..starpo import StarPO

    try:
        return tune.Tuner.restore(str(out), trainable=StarPO, resume_errored=True, storage_filesystem=run_storage())
    except Exception as error:  # noqa: BLE001 (whatever the unpickler or Tune raise, the file is named with it)
        raise ValueError(
            f"--resume: Tune could not read the run's state in {out} ({type(error).__name__}: "
            f"{error}); {out / 'tuner.pkl'} or an experiment_state-*.json there is damaged (a full "
            "disk or a kill while it was written?). Nothing was resumed; start a new run."
        ) from error


class RunInterrupted(RuntimeError):
    """A main job's trials stopped short of their iterations (Ctrl-C): continue it with ``--resume``."""


def _resume_command(out: pathlib.Path) -> list[str]:
    """The command line that continues this run: the job's own, with ``--resume`` and its folder's name."""
    argv = [a for a in sys.argv if a != "--resume"]
    return (
        ["python", *argv[:1], "--resume", "--output-dir", str(out.parent), "--run-name", out.name]
        if argv and argv[0].endswith(".py")
        else ["--resume", "--run-name", out.name]
    )


def _as_list(callbacks) -> list:
    """The callbacks a config already has, without RLlib's do-nothing default."""
    from ray.rllib.callbacks.callbacks import RLlibCallback

    listed = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
    return [c for c in listed if c is not None and c is not RLlibCallback]


def _param_space(config, seeds: list[int], grid: dict[str, list]):
    """The config itself for one trial; else its dict with Tune grid searches over the seeds and the grid."""
    from ray import tune

    if len(seeds) == 1 and not grid:
        return config.copy(copy_frozen=False).debugging(seed=seeds[0])
    space = config.to_dict()
    grid = dict(grid)
    if PRESET_LABEL in grid:
        space.update(
            named_grid(
                PRESET_LABEL,
                {name: config.copy(copy_frozen=False).preset(name) for name in grid.pop(PRESET_LABEL)},
                config.to_dict(),
            )
        )
    if VARIANT_LABEL in grid:
        space.update(
            named_grid(
                VARIANT_LABEL,
                {
                    name: config.copy(copy_frozen=False).update_from_dict(settings)
                    for name, settings in grid.pop(VARIANT_LABEL).items()
                },
                config.to_dict(),
            )
        )
    for name, values in {**grid, **({"seed": seeds} if len(seeds) > 1 else {})}.items():
        space[name] = tune.grid_search(list(values))
    if len(seeds) == 1:
        space["seed"] = seeds[0]
    return space


def named_grid(label: str, variants: dict, base: dict) -> dict:
    """One trial per named config of ``variants`` (a preset's, or a grid's named variant), each with the fields
    its config sets: ``label`` is the grid, and every such field a ``tune.sample_from`` that reads the trial's name
    (Tune's conditional search space). Fields no variant changes keep ``base``'s value (the config's dict); a field
    every variant sets alike is one they change too."""
    from ray import tune

    as_dicts = {name: config.to_dict() for name, config in variants.items()}
    first = next(iter(as_dicts.values()))
    varied = [key for key in first if any(repr(v[key]) != repr(base.get(key)) for v in as_dicts.values())]
    return {
        label: tune.grid_search(list(as_dicts)),
        **{key: tune.sample_from(lambda spec, key=key: as_dicts[spec.config[label]][key]) for key in varied},
    }


def trial_dirname(grid_names, trial) -> str:
    """A trial's folder: its seed and its values of the grid's fields, e.g. ``seed1_lr=0.0003``."""
    params = {k.split("/")[-1]: v for k, v in trial.evaluated_params.items()}
    name = f"seed{trial.config.get('seed')}" + "".join(
        f"_{k}={params[k]}" for k in sorted(grid_names) if k in params and k != "seed"
    )
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", name)[:120]


def _play_baselines(config, baselines: dict, folder: pathlib.Path, headline: str) -> None:
    """Each scripted baseline on the headline environment's validation states, once for the experiment."""
    from ..starpo import StarPO

    folder.mkdir(exist_ok=True)
    tokenizer = config.policy_tokenizer()
    for name, policy in baselines.items():
        trajectories = StarPO.play_validation_states_with(config, policy, tokenizer, env_name=headline)
        write_rollouts(folder.parent / baseline_file(name), trajectories, tokenizer)
    write_text_atomically(
        folder / "names.json", json.dumps({pathlib.Path(baseline_file(n)).name: n for n in baselines})
    )


# EARLY_LOOK_S, and Tune's loop adds a little: lines stay under 15 s apart)
