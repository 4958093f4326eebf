"""What a main job writes, and where: run folders, their JSON records, and rollout files. Three neighbours hold the
rest: the console (``console.py``), what reads a run back (``readers.py``) and the learning curve (``curves.py``).

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
LEAGUE = "league"  # with a league: the snapshots it held at the end, a model folder each (snapshot_<iteration>)
LATEST = "latest"
RUN_CONFIG = "run_config.json"
BASELINES = "baselines"  # scripted baselines' episodes on the validation states (run_job's ``baselines``)
BEFORE_ROLLOUTS = "validation_before.parquet"  # the warm start's validation episodes
AFTER_ROLLOUTS = "validation_rollouts.parquet"  # the trained policy's
BEFORE_GREEDY_ROLLOUTS = "validation_before_greedy.parquet"  # the same states played greedily (temperature 0)
AFTER_GREEDY_ROLLOUTS = "validation_greedy.parquet"
# The validation files paired before -> after RL, by how the policy played: at the validation temperature or greedily.
SAMPLED_AND_GREEDY = {
    "sampled": (BEFORE_ROLLOUTS, AFTER_ROLLOUTS),
    "greedy": (BEFORE_GREEDY_ROLLOUTS, AFTER_GREEDY_ROLLOUTS),
}
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
    record = {
        "command": sys.argv,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "job": vars(job),
        "config": {k: v for k, v in config.to_dict().items() if _is_json(v)},
    }
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
            raise ValueError(
                "--resume continues a run with the settings it started with (Tune restores them), and "
                "these differ (run -> now): "
                + "; ".join(f"{name} {_short(old)} -> {_short(new)}" for name, (old, new) in changed.items())
                + ". Drop those flags to resume, or start a new run with them."
            )
        record = {**earlier, "resumed": record["resumed"]}
    write_text_atomically(out / RUN_CONFIG, json.dumps(record, indent=1))


def changed_settings(before: dict, now: dict) -> dict[str, list]:
    """The config fields whose recorded values differ, as ``{field: [before, now]}`` (None where one lacks it)."""

    def text(value):  # compared as stored: a NaN equals itself there, and key order does not matter
        return json.dumps(value, sort_keys=True)

    return {
        name: [before.get(name), now.get(name)]
        for name in sorted(set(before) | set(now))
        if text(before.get(name)) != text(now.get(name))
    }


def _short(value, width: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."


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
        raise RunFileError(
            f"{path} is {size:,} bytes, more than a run's record can be ({MAX_RUN_JSON_BYTES:,}): it "
            "is damaged, and was not read. Move it aside to read the rest of the run."
        )
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, nesting past the parser
        raise RunFileError(
            f"{path} is not valid JSON ({type(error).__name__}: {str(error)[:200]}): it is damaged. "
            "Move it aside to read the rest of the run."
        ) from None


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


def write_rollouts(
    path: pathlib.Path,
    trajectories: list[Trajectory],
    tokenizer=None,
    *,
    iteration: int = 0,
    advantages: dict[int, list[float]] | None = None,
    append: bool = False,
) -> None:
    """Episodes as Parquet rows: outcome columns, the whole conversation's ``text`` and, with a ``tokenizer``,
    ``turns`` (per turn: the observation before it, the reply, its reasoning and answer, the actions executed, the
    reward, and the reply's tokens with their advantages where ``advantages`` has them, by trajectory index).
    ``iteration`` marks when they were played; ``append`` adds them to the file's rows (training samples)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {
            "env": t.env_name,
            "group": t.group,
            "seed": t.seed,
            "success": t.success,
            "return": t.total_return,
            "turn_rewards": t.turn_rewards,
            "num_turns": t.num_turns,
            "num_actions": t.num_actions,
            "format_errors": t.format_errors,
            "reasoning_claims": t.reasoning_claims,
            "reasoning_claims_true": t.reasoning_claims_true,
            "response_tokens": int(sum(t.response_mask)),
            "total_tokens": len(t.token_ids),
            "truncated": t.truncated,
            "text": t.text,
            "iteration": iteration,
            **({"turns": t.turns(tokenizer, (advantages or {}).get(index))} if tokenizer else {}),
        }
        for index, t in enumerate(trajectories)
    ]
    table = pa.Table.from_pylist(records)
    if append and path.is_file():
        table = pa.concat_tables([pq.read_table(path), table], promote_options="default")
    with written_whole(path) as partial:
        pq.write_table(table, partial)


def baseline_file(name: str) -> str:
    """Where in the run folder the baseline ``name``'s episodes go: ``baselines/<name, letters and digits>.parquet``."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").lower()
    if not slug:
        raise ValueError(f"baseline name {name!r} has no letter or digit to name its file by.")
    return f"{BASELINES}/{slug}.parquet"
