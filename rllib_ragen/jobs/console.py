"""What a main job's console shows: the plan line (:func:`print_plan`), the progress lines a person follows
(:class:`JobConsole`, Tune's callback on the driver), and nothing else: library and framework notices go to the run's
``job.log``, held in memory until the run folder exists (:func:`send_notices_to`) and routed away from it once the run
ends (:func:`close_run_log`); errors still reach the console.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import math
import pathlib
import statistics
import sys
import time

from ray.tune import Callback

from .. import metrics as M
from .callbacks import TIME_BUDGET_STOP
from .curves import SMOOTHING
from .job_times import this_cpu, timing_sentence
from .outputs import (
    BEFORE_GREEDY_ROLLOUTS,
    BEFORE_RL,
    BEFORE_ROLLOUTS,
    LATEST,
    LEARNER,
    PHASE_FILE,
    TRAINING,
    VALIDATED_AT,
    VALIDATION,
    read_run_json,
)
from .readers import read_outcomes, state_of
from .settings import JobSettings
from ..hardware import cpu_computes_bfloat16
from ..sentinel import as_rule
from ..starpo.presets import VARIANT_LABEL

NOISY_LOGGERS = ("ray", "ray.rllib", "transformers", "huggingface_hub", "torch", "accelerate", "py.warnings")

# Notices raised before the run folder exists (RLlib's API-stack notice comes at config validation) wait here.
_EARLY_NOTICES = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)

_run_log: logging.Handler | None = None  # the current run's job.log


def keep_notices_off_the_console() -> None:
    """Library and framework notices (RLlib's API-stack notice and deprecations, "Install gputil", Python
    warnings, transformers' loading bars) stay off the console; errors still reach it. Until
    :func:`send_notices_to` names a run's log file they are held in memory. Safe to call again (Ray re-creates
    its console handler at ``ray.init``)."""
    # Imported first: transformers adds its console handler when its logging module first loads.
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    logging.captureWarnings(True)
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.ERROR)  # the console handlers (Ray's own is a subclass)
        if _run_log not in logger.handlers and _EARLY_NOTICES not in logger.handlers:
            logger.addHandler(_EARLY_NOTICES)
        if not name.startswith("ray"):  # Ray's loggers do not propagate already
            logger.propagate = False  # the root logger's console handler would print them anyway
    hf_logging.disable_progress_bar()  # "Loading weights" bars
    disable_progress_bars()  # "Writing model shards" bars


def send_notices_to(log_file: pathlib.Path) -> None:
    """Write the held notices, and every later one, to ``log_file`` (until :func:`close_run_log`)."""
    global _run_log
    close_run_log()
    _run_log = _RunLog(log_file)
    _run_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    _EARLY_NOTICES.setTarget(_run_log)
    _EARLY_NOTICES.flush()
    _EARLY_NOTICES.setTarget(None)
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if _EARLY_NOTICES in logger.handlers:
            logger.removeHandler(_EARLY_NOTICES)
            logger.addHandler(_run_log)


def close_run_log() -> None:
    """Stop writing to the run's log file: notices after a run must not land in its folder."""
    global _run_log
    if _run_log is None:
        return
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if _run_log in logger.handlers:
            logger.removeHandler(_run_log)
            logger.addHandler(_EARLY_NOTICES)
    try:
        _run_log.close()
    except OSError as error:  # its last notices could not be written (a full disk): said once, never raised over
        _run_log.report(error)  # the job's own error, which must be the job's last words
    _run_log = None


class _RunLog(logging.FileHandler):
    """The run's ``job.log``. A notice it cannot write (a full disk) is reported once on stderr, and the rest go
    nowhere, instead of logging's traceback for every notice burying the job's own last words."""

    failed = False

    def handleError(self, record) -> None:
        self.report(sys.exc_info()[1])

    def report(self, error) -> None:
        if not self.failed:
            self.failed = True
            print(
                f"{self.baseFilename}: notices from here on could not be written ({error})", file=sys.stderr, flush=True
            )


EARLY_LOOK_S = 2.0  # how often the console looks for a trial's before-RL validation and phase on disk


QUIET_S = 12.0  # after this long without a line, the console says what each trial is doing (it looks every


class JobConsole(Callback):
    """Tune's callback on the driver that prints what a person follows: the score before RL, one line per
    iteration with an honest time left (:class:`_Clock`), each validation. With several trials each line starts
    with the trial's folder name."""

    def __init__(
        self, iterations: int, validation_interval: int, env: str, headline: str, trials: int, max_minutes: float = 0.0
    ):
        self.iterations, self.interval, self.env, self.headline = iterations, validation_interval, env, headline
        self.max_minutes = max_minutes
        super().__init__()
        self.several = trials > 1
        self.clocks: dict[str, _Clock] = {}
        self.recent: dict[str, list[dict]] = {}
        self.before: dict[str, float] = {}
        self.errors: dict[str, str] = {}  # a failed trial's folder name: the last line of its error
        self.shown_early: dict[str, set[str]] = {}  # per trial, the before-RL files already printed from disk
        self.next_look = 0.0
        self.last_line = time.monotonic()  # when the console last printed: a quiet stretch gets the trial's phase

    def _say(self, text: str) -> None:
        print(text, flush=True)
        self.last_line = time.monotonic()

    def on_step_end(self, iteration, trials, **info) -> None:
        """The score before RL as soon as the trial has written it to its folder, an iteration before its first
        result reaches the driver (where the trial's folder is on this machine; else from that result); and after
        ``QUIET_S`` without a line, what each trial is doing."""
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + EARLY_LOOK_S
        self._show_early_scores(trials)
        if time.monotonic() - self.last_line >= QUIET_S:
            self._show_phases(trials)

    def _show_phases(self, trials) -> None:
        """What each running trial is doing, from its ``phase.json``, after ``QUIET_S`` without a line."""
        for trial in trials:
            if trial.status not in ("PENDING", "RUNNING") or not trial.path:
                continue
            label = f"[{trial.storage.trial_dir_name}] " if self.several else ""
            try:
                phase = read_run_json(pathlib.Path(trial.path) / PHASE_FILE)
            except (OSError, ValueError):
                continue
            if phase is None:  # no phase yet: Ray is placing the trial, or it builds its algorithm
                self._say(
                    f"{label}  starting the trial: Ray places it, then it builds the algorithm and loads the model"
                )
            elif isinstance(phase, dict) and {"phase", "iteration", "since"} <= set(phase):
                when = "after iteration" if phase.get("ending") else "iteration"
                self._say(
                    f"{label}  {when} {phase['iteration']}: {phase['phase']} "
                    f"({max(0.0, time.time() - float(phase['since'])):.0f} s so far)"
                )

    def _show_early_scores(self, trials) -> None:
        for trial in trials:
            shown = self.shown_early.setdefault(trial.trial_id, set())
            for name, mode in ((BEFORE_ROLLOUTS, "sampled"), (BEFORE_GREEDY_ROLLOUTS, "greedy")):
                path = pathlib.Path(trial.path) / name
                if name in shown or not path.is_file():
                    continue
                try:
                    outcomes = [v for k, v in read_outcomes(path).items() if state_of(k)[0] == self.headline]
                except (OSError, ValueError):  # written whole (renamed into place), so only an unreadable disk
                    continue
                shown.add(name)
                label = f"[{trial.storage.trial_dir_name}] " if self.several else ""
                self._say(
                    f"{label}before RL: validation success {statistics.fmean(outcomes):.3f} {mode} on "
                    f"{len(outcomes)} validation states of {self.headline}"
                )

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        from ray.tune.utils import flatten_dict

        row = flatten_dict(result, delimiter="/")
        label = f"[{trial.storage.trial_dir_name}] " if self.several else ""
        key = VALIDATION + M.env_metric(self.headline, M.SUCCESS)
        before_key = f"{BEFORE_RL}/{TRAINING}{M.env_metric(self.headline, M.SUCCESS)}"
        if before_key in row:
            self.before[trial.trial_id] = row[before_key]
            if BEFORE_ROLLOUTS not in self.shown_early.get(trial.trial_id, ()):  # not printed from disk already
                self._say(
                    f"{label}before RL: validation success {row[before_key]:.3f} on the validation states of "
                    f"{self.headline}"
                )
        done = int(row["training_iteration"])
        clock = self.clocks.setdefault(trial.trial_id, _Clock(self.iterations, self.interval))
        validated = row.get(VALIDATED_AT) == done
        clock.record(
            float(row.get("time_this_iter_s", math.nan)),
            validated,
            row.get(M.TIME_VALIDATE),
            int(row.get(M.VALIDATIONS_IN_ITERATION, 0)),
        )
        rows = self.recent.setdefault(trial.trial_id, [])
        rows[:] = [*rows[-(SMOOTHING - 1) :], row]
        success = TRAINING + M.env_metric(self.env, M.SUCCESS)
        smoothed = statistics.fmean([r.get(success, math.nan) for r in rows])
        left_s = clock.seconds_left(done)
        if self.max_minutes:  # the time budget ends the trial sooner than its iterations would
            left_s = min(left_s, max(0.0, self.max_minutes * 60 - float(row.get("time_total_s", 0.0))))
        out_of_time = bool(row.get(f"job/{TIME_BUDGET_STOP}"))
        self._say(
            f"{label}iter {done:3d}/{self.iterations} | success {row.get(success, math.nan):.2f} "
            f"({SMOOTHING}-it mean {smoothed:.2f}) "
            f"| reward {row.get(TRAINING + M.EPISODE_RETURN_MEAN, math.nan):+.3f} "
            f"(in-group std {row.get(M.FILTER_REWARD_STD, math.nan):.3f}) "
            f"| entropy {row.get(LEARNER + M.ENTROPY, math.nan):.3f} "
            f"| format errors {row.get(TRAINING + M.env_metric(M.POOLED, M.FORMAT_ERROR_RATE), math.nan):.2f} "
            f"| {clock.last_s:.1f} s/it | left ~{0.0 if out_of_time else left_s / 60:.1f} min"
            + (" | no update: the rollout filter kept no group" if row.get(M.FILTER_EMPTY_STEPS, 0) > 0 else "")
        )
        if out_of_time:
            self._say(
                f"{label}time budget: the trial ends after iteration {done} "
                f"({row['time_total_s'] / 60:.1f} of {self.max_minutes:g} min of training; one more iteration "
                "and the closing validation would not fit)"
            )
        if validated or ((done >= self.iterations or out_of_time) and key in row):
            before = self.before.get(trial.trial_id)
            self._say(
                f"{label}  validation at iteration {done}: success {row.get(key, math.nan):.3f}"
                + (f" (before RL {before:.3f})" if before is not None else "")
            )

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        name = trial.storage.trial_dir_name
        self.errors[name] = _last_line(trial.error_file)
        self._say(f"trial {name} failed: {self.errors[name]} (see {trial.path}/error.txt)")


def _last_line(error_file: str | None) -> str:
    """The last line of Tune's error.txt on the driver's own disk (its staging copy, written before the copy into
    the run folder, so readable when that disk is full)."""
    try:
        lines = pathlib.Path(error_file).read_text().strip().splitlines() if error_file else []
    except OSError as error:
        return f"(its error.txt could not be read: {error})"
    return lines[-1] if lines else "(no message)"


def print_plan(config, job: JobSettings, out: pathlib.Path, warm_starts: bool, trials: int) -> None:
    print(f"run folder: {out} ({pathlib.Path(job.output_dir) / LATEST} points here)", flush=True)
    steps = []
    if warm_starts and job.warm_start_steps > 0 and job.warm_start_episodes > 0 and not job.resume:
        cut = f" of at most {job.warm_start_max_turns} turns" if job.warm_start_max_turns else ""
        steps.append(f"warm start {job.warm_start_steps} steps on {job.warm_start_episodes} demonstrations{cut}")
    groups = (
        " + ".join(f"{e.count} {e.name}" for e in config.training_environments())
        if config.train_envs
        else f"{config.num_groups}"
    )
    budget = f" (or fewer: each trial ends within {job.max_minutes:g} min of training)" if job.max_minutes else ""
    steps.append(
        f"{job.iterations} StarPO iterations{budget} of {groups} groups x {config.group_size} episodes"
        + (f" in each of {trials} trials" if trials > 1 else "")
        + _curriculum_plan(config, job.iterations)
    )
    states = (
        ", ".join(f"{e.count} of {e.name}" for e in config.validation_environments())
        if config.is_mixture
        else f"{config.validation_size}"
    )
    when = [
        *(["before RL"] if config.validate_before_training and not job.resume else []),
        *([f"every {config.validation_interval} iterations"] if config.validation_interval else []),
    ]
    steps.append(
        f"validation on {states} validation states {', '.join(when)}{' and ' if when else ''}after the last iteration"
    )
    if config.rollout_dtype or config.autocast_dtype:
        native = "natively" if cpu_computes_bfloat16() else "only emulated, several times slower than float32"
        steps.append(
            f"sampling in {config.sampling_dtype}, the learner's passes in "
            f"{config.autocast_dtype or config.model_config.get('dtype', 'float32')}"
            + (
                f" (this CPU computes bfloat16 {native})"
                if "bfloat16" in (config.sampling_dtype, config.autocast_dtype)
                else ""
            )
        )
    # The table's time for this command (its preset and --quick included) on this kind of CPU: other flags (another
    # model, more iterations) can change it a lot.
    timing = timing_sentence(job.timed_command, *this_cpu()) if job.timed_command else ""
    estimate = f"; {timing}" if timing else ""
    if job.quick:
        estimate += "; --quick: a trial run, whose numbers say nothing about learning"
    print(f"plan: {', '.join(steps)}{estimate}", flush=True)
    for line in _variant_curriculum_plans(config, job):
        print(line, flush=True)
    rules = [as_rule(r) for r in config.sentinel_rules]
    if rules:
        print(f"sentinel: {len(rules)} rules ({', '.join(f'{r.label}: {r.action}' for r in rules)})", flush=True)


def _curriculum_plan(config, iterations: int) -> str:
    """The curriculum's stages as the plan line states them, in parentheses ("" without a curriculum)."""
    return f" ({_curriculum_stages(config, iterations)})" if config.curriculum else ""


def _curriculum_stages(config, iterations: int) -> str:
    """The curriculum's stages in words, 1-based like the progress lines."""
    if not config.curriculum:
        return "no curriculum"
    parts, first = [], 1
    for stage in config.curriculum:
        last = first + stage["iterations"] - 1
        parts.append(f"{first}-{last} on {json.dumps(stage['env_config'])}")
        first = last + 1
    ending = (
        "then env_config as given"
        if first <= iterations
        else f"the run's {iterations} iterations end before env_config as given is ever trained on"
    )
    return f"curriculum: iterations {', '.join(parts)}; {ending}"


def _variant_curriculum_plans(config, job: JobSettings) -> list[str]:
    """One plan line per named grid variant whose curriculum differs from the config's (the plan line above
    describes the config itself)."""
    variants = (job.grid or {}).get(VARIANT_LABEL) or {}
    lines = []
    for name, settings in variants.items():
        variant = config.copy(copy_frozen=False).update_from_dict(settings)
        if variant.curriculum != config.curriculum:
            lines.append(f"grid variant {name}: {_curriculum_stages(variant, job.iterations)}")
    return lines


class _Clock:
    """Time left from the iterations seen so far: a typical iteration (the median of those without validation,
    the first left out once there are others: it carries warm-up) times the iterations left, plus one
    validation's cost per validation left. One-off costs (warm start, model loading, the "before" validation)
    are not iterations and do not inflate it."""

    def __init__(self, iterations: int, validation_interval: int):
        self.iterations, self.interval = iterations, validation_interval
        self.plain: list[float] = []
        self.validating: list[float] = []
        self.validation_s: float | None = None  # one validation's cost, as StarPO timed the latest
        self.first_s: float | None = None
        self.last_s = math.nan

    def record(
        self, seconds: float, validated: bool, validation_seconds: float | None = None, validations: int = 0
    ) -> None:
        """One iteration's ``seconds``; ``validation_seconds``: what its ``validations`` took of them (StarPO times
        them, ``time/validate_s``), so the iteration's own time and one validation's cost are known apart, from
        the first iteration on (whose "before RL" validation is one)."""
        self.last_s = seconds
        if validations and validation_seconds is not None and math.isfinite(validation_seconds):
            self.validation_s = validation_seconds / validations
            seconds, validated = max(0.0, seconds - validation_seconds), False
        if self.first_s is None:
            self.first_s = seconds  # warm-up (first passes through the model, allocator growth): not typical
        else:
            (self.validating if validated else self.plain).append(seconds)

    def seconds_left(self, iteration: int) -> float:
        typical = statistics.median(self.plain or self.validating or [self.first_s])
        validation = self.validation_s
        if validation is None and self.validating and self.plain:
            validation = max(0.0, statistics.mean(self.validating) - typical)
        left = range(iteration + 1, self.iterations + 1)
        validations = sum(1 for i in left if self.interval and i % self.interval == 0)
        if self.iterations > iteration and not (self.interval and self.iterations % self.interval == 0):
            validations += 1  # the closing validation after the last iteration
        return typical * len(left) + (validation or 0.0) * validations
