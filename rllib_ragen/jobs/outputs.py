"""What a main job writes, and where: run folders, the quiet console, rollout files, the learning curve.

A run folder is a Tune experiment folder, ``<output_dir>/<YYYYmmdd-HHMMSS>_seed<seed>/`` (or
``<output_dir>/<run_name>/``), and ``<output_dir>/latest`` points at the newest. It holds ``run_config.json`` (the
config and settings it ran with, and the command), ``job.log`` (library notices kept off the console),
``baselines/``, the experiment's ``summary.json`` and one folder per trial. A trial folder holds Tune's
``progress.csv``, ``result.json``, TensorBoard events and ``checkpoint_<n>/``, and the job's outputs
(:mod:`rllib_ragen.jobs.callbacks`, :mod:`rllib_ragen.jobs.report`): ``validation_before.parquet`` and
``validation_rollouts.parquet`` (the validation episodes before and after RL, with their text), their greedy
twins, ``training_rollouts/``, ``sentinel.json``, ``machine.json``, ``policy/``, ``rollouts.html``, ``summary.json`` and
``learning_curve.png``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import logging.handlers
import math
import os
import pathlib
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from .. import metrics as M
from ..files import write_text_atomically, written_whole
from ..sentinel import as_rule

if TYPE_CHECKING:  # (the job layer runs no rollouts: it writes the algorithm's)
    from ..rollout.trajectory import Trajectory

POLICY = "policy"  # the trained model, loadable by plain transformers
LATEST = "latest"
RUN_CONFIG = "run_config.json"
BASELINES = "baselines"  # scripted baselines' episodes on the validation states (run_job's ``baselines``)
BEFORE_ROLLOUTS = "validation_before.parquet"  # the warm start's validation episodes
AFTER_ROLLOUTS = "validation_rollouts.parquet"  # the trained policy's
BEFORE_GREEDY_ROLLOUTS = "validation_before_greedy.parquet"  # the same states played greedily (temperature 0)
AFTER_GREEDY_ROLLOUTS = "validation_greedy.parquet"
TRAINING_ROLLOUTS = "training_rollouts"  # a sample of training episodes every few iterations: one Parquet file each
BEFORE_RL = "before_rl"  # the first result's copy of the validation played before any update
LEARNING_CURVE = "learning_curve.png"  # the report's curves, which the rollout viewer shows too
WARM_START_CURVE = "warm_start_curve.csv"  # greedy validation success during the warm start (warm_start_eval_interval)
VIEWER_PAGE = "rollouts.html"
SENTINEL_FILE = "sentinel.json"  # the sentinel's firings over the run
MACHINE = "machine.json"  # where each session of a trial ran: its CPU and kernels, GPUs, threads, packages
PHASE_FILE = "phase.json"  # what the trial is doing now (sampling, updating, validating...) and since when

# Where the driver reads its numbers in a flattened result row (paths in Algorithm.train()'s result).
TRAINING = "env_runners/"
VALIDATION = "evaluation/env_runners/"
LEARNER = "learners/default_policy/"
VALIDATED_AT = VALIDATION + M.VALIDATION_ITERATION


# ---- run folders ------------------------------------------------------------------------------------------------
def start_run_folder(out: pathlib.Path, config, job) -> None:
    """Create the run folder, point ``latest`` at it, and record what it runs with."""
    out.mkdir(parents=True, exist_ok=True)
    latest = out.parent / LATEST
    if not latest.exists() or latest.is_symlink():  # never replace a real folder a user named "latest"
        link = out.parent / f".{LATEST}.{os.getpid()}"
        link.unlink(missing_ok=True)
        link.symlink_to(out.name, target_is_directory=True)
        os.replace(link, latest)  # atomic: ``latest`` always points at a whole run folder
    record = {"command": sys.argv, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "job": vars(job),
              "config": {k: v for k, v in config.to_dict().items() if _is_json(v)}}
    record["config"]["sentinel_rules"] = [dataclasses.asdict(as_rule(r)) for r in config.sentinel_rules]
    record = json.loads(json.dumps(record, default=str))  # compared below as it is stored
    earlier = read_run_json(out / RUN_CONFIG, {})
    if job.resume:
        record["resumed"] = [*earlier.get("resumed", []), record["started"]]
        changed = changed_settings(earlier.get("config", {}), record["config"])
        ran_for = earlier.get("job", {}).get("iterations")
        if ran_for is not None and ran_for != job.iterations:
            changed["iterations"] = [ran_for, job.iterations]
        if changed:  # Tuner.restore continues with the settings the run started with: other values would be ignored
            raise ValueError("--resume continues a run with the settings it started with (Tune restores them), and "
                             "these differ (run -> now): " + "; ".join(f"{name} {_short(old)} -> {_short(new)}"
                                                                       for name, (old, new) in changed.items())
                             + ". Drop those flags to resume, or start a new run with them.")
        record = {**earlier, "resumed": record["resumed"]}
    write_text_atomically(out / RUN_CONFIG, json.dumps(record, indent=1))


def changed_settings(before: dict, now: dict) -> dict[str, list]:
    """The config fields whose recorded values differ, as ``{field: [before, now]}`` (None where one lacks it)."""
    def text(value):  # compared as stored: a NaN equals itself there, and key order does not matter
        return json.dumps(value, sort_keys=True)

    return {name: [before.get(name), now.get(name)] for name in sorted(set(before) | set(now))
            if text(before.get(name)) != text(now.get(name))}


def _short(value, width: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _is_json(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


MAX_RUN_JSON_BYTES = 64 << 20  # a run's JSON records are kilobytes; a larger one is damaged, and is not read


class RunFileError(ValueError):
    """A run folder's file is damaged: too large, or not JSON. Its message names the file."""


def read_run_json(path: pathlib.Path, default: Any = None) -> Any:
    """A JSON file of a run folder (``default`` when it does not exist): never larger than ``MAX_RUN_JSON_BYTES``
    read, and a damaged one named in a :class:`RunFileError`, not a bare ``JSONDecodeError``."""
    path = pathlib.Path(path)
    if not path.is_file():
        return default
    size = path.stat().st_size
    if size > MAX_RUN_JSON_BYTES:
        raise RunFileError(f"{path} is {size:,} bytes, more than a run's record can be ({MAX_RUN_JSON_BYTES:,}): it "
                           "is damaged, and was not read. Move it aside to read the rest of the run.")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, nesting past the parser
        raise RunFileError(f"{path} is not valid JSON ({type(error).__name__}: {str(error)[:200]}): it is damaged. "
                           "Move it aside to read the rest of the run.") from None


# ---- quiet console ------------------------------------------------------------------------------------------------
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
            print(f"{self.baseFilename}: notices from here on could not be written ({error})", file=sys.stderr,
                  flush=True)


# ---- result rows and JSON ---------------------------------------------------------------------------------------
def json_ready(value):
    """``value`` with every non-finite float (NaN: not measured) as None, so that a file written from it is standard
    JSON that any reader parses (jq, JavaScript); Python's json would write the bare token NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def write_csv(path: pathlib.Path, rows: list[dict]) -> None:
    columns = sorted({k for row in rows for k in row})
    with written_whole(path) as partial, open(partial, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_rollouts(path: pathlib.Path, trajectories: list[Trajectory], tokenizer=None, *, iteration: int = 0,
                   advantages: dict[int, list[float]] | None = None, append: bool = False) -> None:
    """Episodes as Parquet rows: outcome columns, the whole conversation's ``text`` and, with a ``tokenizer``,
    ``turns`` (per turn: the observation before it, the reply, its reasoning and answer, the actions executed, the
    reward, and the reply's tokens with their advantages where ``advantages`` has them, by trajectory index).
    ``iteration`` marks when they were played; ``append`` adds them to the file's rows (training samples)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"env": t.env_name, "group": t.group, "seed": t.seed, "success": t.success, "return": t.total_return,
                "turn_rewards": t.turn_rewards, "num_turns": t.num_turns, "num_actions": t.num_actions,
                "format_errors": t.format_errors, "reasoning_claims": t.reasoning_claims,
                "reasoning_claims_true": t.reasoning_claims_true, "response_tokens": int(sum(t.response_mask)),
                "total_tokens": len(t.token_ids), "truncated": t.truncated, "text": t.text, "iteration": iteration,
                **({"turns": t.turns(tokenizer, (advantages or {}).get(index))} if tokenizer else {})}
               for index, t in enumerate(trajectories)]
    table = pa.Table.from_pylist(records)
    if append and path.is_file():
        table = pa.concat_tables([pq.read_table(path), table], promote_options="default")
    with written_whole(path) as partial:
        pq.write_table(table, partial)


def result_row(result: dict) -> dict[str, float]:
    """An RLlib result as one flat row of its numbers, each named by its path as Tune's loggers name it
    (``env_runners/episode_return_mean``); the config and anything not a number left out."""
    import numpy as np
    from ray.tune.utils import flatten_dict

    flat = flatten_dict({k: v for k, v in result.items() if k != "config"}, delimiter="/")
    return {k: float(v) for k, v in flat.items()
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))}


def read_results(trial: pathlib.Path) -> list[dict]:
    """Tune's results of a trial (its ``result.json``), one flat row per iteration (:func:`result_row`); an
    iteration a restored trial played again keeps its last result. Empty without the file."""
    by_iteration: dict[int, dict] = {}
    path = pathlib.Path(trial) / "result.json"
    for number, line in enumerate(path.read_text().splitlines() if path.is_file() else [], start=1):
        if not line.strip():
            continue
        try:
            row = result_row(json.loads(line))
            by_iteration[int(row["training_iteration"])] = row
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"{path}, line {number}, is not one of Tune's results ({type(error).__name__}: "
                             f"{error}); the file is damaged (a full disk or a kill while it was written?). "
                             "Remove or repair that line and report again.") from None
    return [by_iteration[i] for i in sorted(by_iteration)]


def baseline_file(name: str) -> str:
    """Where in the run folder the baseline ``name``'s episodes go: ``baselines/<name, letters and digits>.parquet``."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").lower()
    if not slug:
        raise ValueError(f"baseline name {name!r} has no letter or digit to name its file by.")
    return f"{BASELINES}/{slug}.parquet"


def baseline_name(file: pathlib.Path) -> str:
    """A baseline's name as the job gave it (recorded beside its episodes, ``names.json``), else the file's stem."""
    names = file.parent / "names.json"
    return read_run_json(names, {}).get(file.name, file.stem)


def outcomes_by_state(episodes) -> dict[str, float]:
    """Success per validation state, keyed ``"<env>:<seed>"`` (two environments' same seed stay apart): the mean
    over the state's episodes when validation plays several (``validation_group_size``). The state, not the
    episode, is what a paired comparison pairs: one state's episodes share its difficulty, and the k-th episode
    before has no more to do with the k-th after than with any other, so pairing episodes would count each state's
    luck several times and narrow the interval. String keys, so the outcomes are JSON. ``episodes`` yields
    ``(env name, seed, success)``."""
    totals: dict[str, tuple[float, int]] = {}
    for env, seed, success in episodes:
        key = f"{env}:{int(seed)}"
        total, count = totals.get(key, (0.0, 0))
        totals[key] = (total + float(success), count + 1)
    return {key: total / count for key, (total, count) in totals.items()}


def state_of(outcome_key: str) -> tuple[str, int]:
    """The ``(env name, seed)`` of an :func:`outcomes_by_state` key."""
    env, seed = outcome_key.rsplit(":", 1)
    return env, int(seed)


def trajectory_outcomes(trajectories) -> dict[str, float]:
    """:func:`outcomes_by_state` of played trajectories."""
    return outcomes_by_state((t.env_name, t.seed, t.success) for t in trajectories)


def read_outcomes(path: pathlib.Path) -> dict[str, float]:
    """:func:`outcomes_by_state` of a rollouts file written by :func:`write_rollouts`."""
    import pyarrow.parquet as pq

    records = pq.read_table(path, columns=["env", "seed", "success"]).to_pylist()
    return outcomes_by_state((r["env"], r["seed"], r["success"]) for r in records)


def read_first_reasonings(path: pathlib.Path, envs: set[str] | None = None) -> list[str] | None:
    """The first turn's reasoning (``<think>`` text) of each episode of a rollouts file written by
    :func:`write_rollouts`, of the environments named ``envs`` (None: all); None for a file without turns."""
    import pyarrow.parquet as pq

    if "turns" not in pq.read_schema(path).names:
        return None
    records = pq.read_table(path, columns=["env", "turns"]).to_pylist()
    return [r["turns"][0]["think"] if r["turns"] else "" for r in records if envs is None or r["env"] in envs]


def read_reasoning_claims(path: pathlib.Path, envs: set[str] | None = None) -> tuple[int, int]:
    """``(checked, true)`` summed over the episodes of a rollouts file (see ``TextEnv.reasoning_claims``), of the
    environments named ``envs`` (None: all); (0, 0) for a file written before the columns existed."""
    import pyarrow.parquet as pq

    if "reasoning_claims" not in pq.read_schema(path).names:
        return 0, 0
    records = pq.read_table(path, columns=["env", "reasoning_claims", "reasoning_claims_true"]).to_pylist()
    kept = [r for r in records if envs is None or r["env"] in envs]
    return sum(r["reasoning_claims"] for r in kept), sum(r["reasoning_claims_true"] for r in kept)


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` finite values up to each point (NaN until one exists)."""
    out = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i + 1 - window):i + 1] if math.isfinite(v)]
        out.append(sum(recent) / len(recent) if recent else math.nan)
    return out


SMOOTHING = 5  # iterations in the trailing mean drawn over noisy training series


def learning_curve_panels(env: str) -> list[tuple[str, str]]:
    """The learning curve's panels in order, each as (result row column, as Tune's progress.csv names it; title)."""
    return [
        (TRAINING + M.env_metric(env, M.SUCCESS), "success"),
        (TRAINING + M.env_metric(M.POOLED, M.FORMAT_ERROR_RATE), "format-error rate"),
        (M.RESPONSE_LENGTH, "generated tokens per trajectory"),
        (M.FILTER_REWARD_STD, "in-group reward std"),
        (LEARNER + M.ENTROPY, "entropy"),
        (LEARNER + M.GRAD_NORM.format(optimizer="actor"), "actor grad norm"),
        (M.REASONING_ENTROPY, "reasoning entropy, first turn (nats)"),
        (TRAINING + M.env_metric(M.POOLED, M.EFFECTIVE_ACTION_RATE), "actions that changed the state"),
        (TRAINING + M.env_metric(M.POOLED, M.REASONING_GROUNDED), "reasoning grounded (claims that hold)"),
    ]


# The echo-trap probe's signals (collapse_diagnostics_interval), drawn after the others when a run logged them.
ECHO_TRAP_PANELS = [
    (M.MI_ESTIMATE, "MI estimate, prompts and reasonings (nats; an estimate, can dip below 0)"),
    (M.RETRIEVAL_ACCURACY, "retrieval accuracy of the prompt from its reasoning"),
    (M.DISTINCT_2, "distinct-2 of the reasonings"),
    (M.THINK_TOKENS_PER_TURN, "reasoning tokens per turn"),
]

# One line on each panel, shown under the curves in the rollout viewer: what it measures, and what a bad sign is.
PANEL_EXPLANATIONS = {
    "success": "share of episodes solved: training (raw and smoothed) and the fixed validation states (red)",
    "format-error rate": "share of replies off the <think>/<answer> template or naming no valid action",
    "generated tokens per trajectory": "tokens the policy sampled in an episode, all turns together",
    "in-group reward std": "spread of returns among episodes from one start; near 0 everywhere: nothing left to learn "
                           "from (RAGEN's filter keeps the groups where it is highest)",
    "entropy": "the policy's mean token entropy on the update's tokens; a fall to near 0 is collapse",
    "actor grad norm": "size of the policy's gradient before clipping",
    "reasoning entropy, first turn (nats)": "how varied the first turn's reasoning is across episodes; falling while "
                                            "success does not rise: one template for every state",
    "actions that changed the state": "share of executed actions that changed the environment's state",
    "reasoning grounded (claims that hold)": "share of checkable claims in the reasoning (\"Up wall\") that are true",
    ECHO_TRAP_PANELS[0][1]: "how much a reasoning tells about the state it answers (InfoNCE bound; at most log of the "
                            "probe's size); near 0: the same reasoning for every state, the echo trap. An estimate "
                            "from a few rows: it can dip below 0, which means no information found",
    ECHO_TRAP_PANELS[1][1]: "how often a reasoning's own prompt explains it better than the other prompts do; at "
                            "chance, the reasoning ignores the state",
    ECHO_TRAP_PANELS[2][1]: "distinct token pairs over all pairs of the replies; falling: replies repeat each other",
    ECHO_TRAP_PANELS[3][1]: "length of the <think> block; traces shrink before they vanish",
}


# Why a panel can be empty in a run that works.
PANEL_EMPTY_REASONS = {
    "reasoning entropy, first turn (nats)": ":\nno reasoning in the replies",
    "reasoning grounded (claims that hold)": ":\nthe environment checks no claims",
}


def drawn_panels(rows: list[dict], env: str) -> list[tuple[str, str]]:
    """The learning curve's panels for these result rows: the nine, then the echo-trap probe's where logged."""
    return learning_curve_panels(env) + [(key, name) for key, name in ECHO_TRAP_PANELS
                                         if any(math.isfinite(r.get(key, math.nan)) for r in rows)]


def validations_of(rows: list[dict]) -> list[dict]:
    """Each validation once, in order, as ``{evaluation/env_runners/...: value}`` (the one before RL first)."""
    validations: list[dict] = []
    if rows and BEFORE_RL + "/" in "".join(rows[0]):
        validations.append({VALIDATION + k.removeprefix(f"{BEFORE_RL}/{TRAINING}"): v for k, v in rows[0].items()
                            if k.startswith(f"{BEFORE_RL}/{TRAINING}")})
    for row in rows:
        at = row.get(VALIDATED_AT, math.nan)
        if math.isfinite(at) and (not validations or validations[-1][VALIDATED_AT] != at):
            validations.append({k: v for k, v in row.items() if k.startswith(VALIDATION)})
    return validations


def validation_points(validations: list[dict], column: str, env: str,
                    validation_env: str | None = None) -> list[tuple[float, float]]:
    """(iteration, value) of a training rollout column (``env_runners/...``) in each validation that logged it:
    the validation counterpart a learning-curve panel draws beside the training series. A pooled column
    (``rollout/...``) and a column of the training environment ``env`` are read on ``validation_env`` (default
    ``env``), the environment the final table scores: validation may also play variants that training never sees,
    and pooling them would not compare with training; and a run may validate only on environments it does not
    train on. None for learner columns."""
    if not column.startswith(TRAINING):
        return []
    name = column.removeprefix(TRAINING)
    for prefix in (M.env_metric(M.POOLED, ""), M.env_metric(env, "")):
        if name.startswith(prefix):
            name = M.env_metric(validation_env or env, name.removeprefix(prefix))
            break
    key = VALIDATION + name
    return [(v[VALIDATED_AT], v[key]) for v in validations
            if isinstance(v.get(key), (int, float)) and math.isfinite(v[key])]


def plot_learning_curve(path, rows: list[dict], validations: list[dict], env: str, title: str,
                        known_scores: dict[str, float] | None = None, validation_env: str | None = None,
                        firings: list[dict] = ()) -> bool:
    """Nine panels over iterations (:func:`learning_curve_panels`): success (training raw and smoothed, validation
    joined, known scores), format-error rate, response length, in-group reward std, token entropy, actor grad
    norm, the first turn's reasoning entropy (the template collapse that token entropy and distinct-2 can miss),
    the share of actions that changed the state, and the share of checkable claims in the reasoning that hold.
    A rollout panel also draws its validation values (on ``validation_env``, default ``env``, the training
    environment) where validation logs them. A panel whose signal the run never logged says so. The echo-trap
    probe's panels (``ECHO_TRAP_PANELS``) follow when the run logged them, and the sentinel's ``firings`` are red
    lines on every panel. The one renderer of a run's curves: the rollout viewer shows this picture.

    ``path``: a file name or a binary file. Returns False (nothing drawn) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no {getattr(path, 'name', 'learning curve')}: pip install matplotlib, or rllib_ragen[plots])")
        return False
    steps = [r["training_iteration"] for r in rows]
    panels = drawn_panels(rows, env)
    columns = 3 if len(panels) <= 9 else 4
    lines = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.3 * lines), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (key, name) in zip(axes.flat, panels):
        series = [r.get(key, math.nan) for r in rows]
        validated = validation_points(validations, key, env, validation_env)
        if not validated and not any(isinstance(v, (int, float)) and math.isfinite(v) for v in series):
            # answer-only replies have no reasoning; say so rather than leave an empty frame that looks broken
            ax.text(0.5, 0.5, "not logged in this run" + PANEL_EMPTY_REASONS.get(name, ""), ha="center",
                    va="center", transform=ax.transAxes, color="gray", wrap=True)
            ax.set_yticks([])
            if steps:
                ax.set_xlim(min(steps), max(steps) + 1)
        ax.plot(steps, series, color="tab:blue", alpha=0.35, linewidth=1, label="training (raw)")
        ax.plot(steps, trailing_mean(series, SMOOTHING), color="tab:blue", linewidth=2,
                label=f"training ({SMOOTHING}-iteration mean)")
        if validated:
            ax.plot(*zip(*validated), "s-", color="tab:red", label="validation")
        for firing in firings:
            ax.axvline(firing["iteration"], color="#c22", linewidth=1, alpha=0.7)
        ax.set_title(name)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    ax = axes.flat[0]
    styles = iter(["--", ":", "-."])
    for name, value in (known_scores or {}).items():
        if value is not None and math.isfinite(value):
            ax.axhline(value, color="gray", linestyle=next(styles, "--"), linewidth=1, label=f"{name} {value:.2f}")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="best", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return True
