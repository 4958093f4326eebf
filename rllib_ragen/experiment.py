"""The main-job driver behind ``tuned_examples/``: warm start, StarPO training with progress, and outputs.

Plain calls, no trainer framework. A job file defines its ``StarPOConfig`` and its :class:`JobSettings` (output
folder, iterations, warm start, pass bar); :func:`parse_job_args` lays the command-line flags over both; then
:func:`run_job` warm-starts the policy on demonstrations, builds the algorithm, trains it while printing progress,
and writes what a user needs to judge the run.

Outputs in ``output_dir``: ``metrics.csv`` (one row per iteration, every scalar result, named by its path in the
result: ``env_runners/...``, ``learners/default_policy/...``), ``learning_curve.png`` (success, reward std,
entropy, grad norm per iteration; needs matplotlib), ``validation_rollouts.parquet`` (the last validation's
episodes, with their text), ``policy/`` (the trained model, loadable by plain transformers), ``summary.json``
(before/after validation metrics, throughput, wall time), ``warm_start/`` (the SFT model) and ``checkpoint/`` (the
algorithm every ``checkpoint_interval`` iterations and after the last; ``resume`` continues from it).

Example::

    config = StarPOConfig().environment("rllib_ragen/Bandit-v0").training(validation_interval=10)
    config, job = parse_job_args(config, JobSettings(output_dir="outputs/bandit", iterations=10))
    run_job(config, job, demonstration_policy=random_arm_policy(seed=0))
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import pathlib
import sys
import time
from typing import Callable

import torch

from . import metrics as M
from .experiment_flags import JobSettings, parse_job_args, user_model_config
from .rollout.engine import Trajectory
from .starpo.checkpoints import recover_interrupted_save

__all__ = ["JobSettings", "parse_job_args", "run_job", "warm_start"]

# Where the driver reads its numbers in a flattened result row (paths in Algorithm.train()'s result).
TRAINING = "env_runners/"
VALIDATION = "evaluation/env_runners/"
LEARNER = "learners/default_policy/"
VALIDATED_AT = VALIDATION + M.VALIDATION_ITERATION
SUMMARY_METRICS = (M.SUCCESS, "pass@1", M.VALID_ACTION_RATE, M.FORMAT_ERROR_RATE, M.RETURN_MEAN, M.NUM_ACTIONS)


def warm_start(config, job: JobSettings, policy: Callable[[str], str], path: pathlib.Path) -> str:
    """Fine-tune the config's model on ``policy``'s demonstrations; save it to ``path`` and return that path."""
    from .rollout.models import load_policy
    from .sft import collect_demonstrations, supervised_warm_start

    t0 = time.perf_counter()
    sft_log = logging.getLogger("rllib_ragen.sft")  # its every-50-steps loss lines are this job's progress
    if not sft_log.handlers:
        sft_log.addHandler(logging.StreamHandler(sys.stdout))
        sft_log.setLevel(logging.INFO)
    seed = config.seed or 0
    model, tokenizer = load_policy(config.model_config["model"], seed=seed)
    demos = collect_demonstrations(config.rollout_config(), policy, tokenizer, job.warm_start_episodes)
    losses = supervised_warm_start(model, demos, steps=job.warm_start_steps, batch_size=job.warm_start_batch_size,
                                   lr=job.warm_start_lr, seed=seed, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    print(f"warm start: {len(demos)} demonstrations ({sum(t.success for t in demos) / len(demos):.0%} successful), "
          f"{job.warm_start_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return str(path)


def run_job(config, job: JobSettings, demonstration_policy: Callable[[str], str] | None = None) -> dict:
    """Warm start (when a demonstration policy is given), train, and write the outputs. Returns the summary.

    Validation runs before training and every ``validation_interval`` iterations, as the config says, and once
    more after the last iteration when that one did not validate, so "after" is always the trained policy. The
    verdict against ``job.pass_bar`` (the least rise of validation success over the warm start that counts as
    learning) is printed and stored in the summary (``success_gain``, ``passed``).
    """
    import ray

    job.validate()
    out = pathlib.Path(job.output_dir).resolve()
    check_output_paths(out)  # before any work: a run must not train for minutes and then fail to save
    checkpoint = out / CHECKPOINT
    check_resume(checkpoint, job.resume)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(job.threads)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    t_start = time.perf_counter()

    base_model = config.model_config["model"]
    if demonstration_policy is not None and job.warm_start_steps > 0 and job.warm_start_episodes > 0:
        warm_dir = out / "warm_start"
        if job.resume and (warm_dir / "config.json").is_file():
            model = str(warm_dir)  # the checkpoint was trained from it; fine-tuning again would only cost time
            print(f"warm start: reusing {warm_dir}", flush=True)
        else:
            model = warm_start(config, job, demonstration_policy, warm_dir)
        config = config.copy(copy_frozen=False).rl_module(model_config={**user_model_config(config), "model": model})
    algo = config.build_algo()
    rows: list[dict] = []
    validations: list[dict] = []
    try:
        if job.resume:
            algo.restore_from_path(checkpoint)
            rows = _read_csv(out / "metrics.csv", up_to=algo.iteration)
            for row in rows:
                _keep_validation(row, validations)
            print(f"resumed from {checkpoint} at iteration {algo.iteration} ({len(rows)} rows of metrics.csv kept)",
                  flush=True)
        t_train, first = time.perf_counter(), algo.iteration  # the time-left estimate counts this run's iterations
        while algo.iteration < job.iterations:
            row = _flatten(algo.train())
            rows.append(row)
            _keep_validation(row, validations)
            _print_progress(config.env, job.iterations, row, t_train, first)
            _write_csv(out / "metrics.csv", rows)
            if job.checkpoint_interval and (algo.iteration % job.checkpoint_interval == 0
                                            or algo.iteration == job.iterations):
                algo.save_to_path(checkpoint)
        if (not algo.last_validation or not validations
                or validations[-1][VALIDATED_AT] != algo.iteration):
            _keep_validation(_flatten({"evaluation": {"env_runners": algo.evaluate_validation_set()}}), validations)
        _write_rollouts(out / "validation_rollouts.parquet", algo.last_validation)
        algo.export_pretrained(out / "policy")
    finally:
        algo.stop()
    summary = _summary(config, base_model, rows, validations, time.perf_counter() - t_start)
    summary["success_gain"] = summary["after"][M.SUCCESS] - summary["before"][M.SUCCESS]
    summary["passed"] = bool(summary["success_gain"] >= job.pass_bar)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot(out / "learning_curve.png", rows, validations, config.env)
    _print_table(summary, config)
    print(f"success gain {summary['success_gain']:+.3f} (bar {job.pass_bar}): "
          f"{'PASS' if summary['passed'] else 'below the bar'}")
    return summary


# ---- outputs --------------------------------------------------------------------------------------------------
CHECKPOINT = "checkpoint"
OUTPUT_FOLDERS = ("policy", "warm_start", CHECKPOINT)
OUTPUT_FILES = ("metrics.csv", "summary.json", "learning_curve.png", "validation_rollouts.parquet")


def check_output_paths(out: pathlib.Path) -> None:
    """Fail before any work when an output could not be written where it goes (a file where a folder must be, or
    the reverse): transformers' ``save_pretrained`` onto a file only logs an error, and the trained policy is lost.
    """
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output_dir {out} is a file; choose another --output-dir.")
    wrong = [out / name for name in OUTPUT_FOLDERS if (out / name).exists() and not (out / name).is_dir()]
    wrong += [out / name for name in OUTPUT_FILES if (out / name).is_dir()]
    if wrong:
        raise FileExistsError(f"these outputs would not be written: {[str(p) for p in wrong]} (a file where a folder "
                              "goes, or a folder where a file goes); move them or choose another --output-dir.")


def check_resume(checkpoint: pathlib.Path, resume: bool) -> None:
    """Before any work: ``resume`` needs a checkpoint, and a fresh run must not overwrite an earlier run's."""
    recover_interrupted_save(checkpoint)  # a kill mid-save may have left the last checkpoint beside its place
    if resume and not (checkpoint / "rllib_checkpoint.json").is_file():
        raise FileNotFoundError(f"--resume: there is no checkpoint at {checkpoint}. Resume with the --output-dir of "
                                "the run to continue, or start without --resume.")
    if not resume and checkpoint.exists():
        raise FileExistsError(f"{checkpoint.parent} holds the checkpoint of an earlier run. Continue it with --resume "
                              "(raise --iterations to train longer), or choose another --output-dir. Nothing was "
                              "overwritten.")


def _read_csv(path: pathlib.Path, up_to: int) -> list[dict]:
    """The rows of a metrics.csv written by an earlier run, up to iteration ``up_to`` (later ones were never
    checkpointed: they are trained again)."""
    if not path.is_file():
        logging.getLogger(__name__).warning("%s is missing: the resumed run's metrics start at this iteration.", path)
        return []
    with open(path, newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    return [row for row in rows if row.get("training_iteration", math.inf) <= up_to]


def _flatten(result: dict, prefix: str = "") -> dict:
    """Scalar results as one flat row, each named by its path in the result (``env_runners/episode_return_mean``)."""
    row = {}
    for key, value in result.items():
        if key == "config":
            continue
        if isinstance(value, dict):
            row.update(_flatten(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "item"):
            try:
                row[prefix + key] = float(value)
            except (TypeError, ValueError):
                continue
    return row


def _keep_validation(row: dict, validations: list[dict]) -> None:
    """Remember a row's validation metrics once: rows between validations repeat (or lack) the last ones."""
    validated_at = row.get(VALIDATED_AT, math.nan)
    if math.isfinite(validated_at) and (not validations or validations[-1][VALIDATED_AT] != validated_at):
        validations.append({k: v for k, v in row.items() if k.startswith(VALIDATION)})


def _print_progress(env: str, iterations: int, row: dict, t_start: float, first: int = 0) -> None:
    done = int(row["training_iteration"])
    elapsed = time.perf_counter() - t_start
    left = elapsed / (done - first) * (iterations - done)
    print(f"iter {done:3d}/{iterations} | success {row.get(TRAINING + M.env_metric(env, M.SUCCESS), math.nan):.2f} "
          f"| reward {row.get(TRAINING + M.EPISODE_RETURN_MEAN, math.nan):+.3f} "
          f"(in-group std {row.get(M.FILTER_REWARD_STD, math.nan):.3f}) "
          f"| entropy {row.get(LEARNER + M.ENTROPY, math.nan):.3f} "
          f"| format errors {row.get(TRAINING + M.env_metric(M.POOLED, M.FORMAT_ERROR_RATE), math.nan):.2f} "
          f"| {row.get('time_this_iter_s', math.nan):.1f} s/it | left ~{left / 60:.1f} min", flush=True)


def _write_csv(path: pathlib.Path, rows: list[dict]) -> None:
    columns = sorted({k for row in rows for k in row})
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _write_rollouts(path: pathlib.Path, trajectories: list[Trajectory]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"env": t.env_name, "group": t.group, "seed": t.seed, "success": t.success, "return": t.total_return,
                "turn_rewards": t.turn_rewards, "num_turns": t.num_turns, "num_actions": t.num_actions,
                "format_errors": t.format_errors, "response_tokens": int(sum(t.response_mask)),
                "total_tokens": len(t.token_ids), "truncated": t.truncated, "text": t.text} for t in trajectories]
    pq.write_table(pa.Table.from_pylist(records), path)


def _summary(config, base_model: str, rows: list[dict], validations: list[dict], wall_s: float) -> dict:
    def val(index: int, name: str) -> float:
        return validations[index].get(VALIDATION + M.env_metric(config.env, name), math.nan) if validations else math.nan

    pooled = TRAINING + M.POOLED + "/"
    generated = sum(r.get(pooled + M.RESPONSE_TOKENS_PER_TURN, 0) * r.get(pooled + M.NUM_TURNS, 0)
                    * r.get(pooled + M.NUM_TRAJECTORIES, 0) for r in rows)
    generate_s = sum(r.get(TRAINING + M.TIME_GENERATE, 0) for r in rows)
    return {
        "env": config.env, "model": base_model, "iterations": len(rows),
        "validation_episodes": int(val(0, M.NUM_TRAJECTORIES)) if validations else 0,
        "validation_temperature": config.validation_temperature,
        "before": {n: val(0, n) for n in SUMMARY_METRICS}, "after": {n: val(-1, n) for n in SUMMARY_METRICS},
        "validated_at": [int(v[VALIDATED_AT]) for v in validations],
        "rollout_tokens_per_s": generated / generate_s if generate_s else math.nan,
        "update_tokens_per_s": rows[-1].get(LEARNER + M.UPDATE_TOKENS_PER_S, math.nan) if rows else math.nan,
        "wall_time_s": wall_s,
    }


def _print_table(summary: dict, config) -> None:
    print(f"\n{summary['env']}, model {summary['model']}, {summary['iterations']} iterations, validation on "
          f"{summary['validation_episodes']} held-out initial states (temperature {config.validation_temperature})")
    print(f"{'':28s}{'before':>10s}{'after':>10s}")
    for name in SUMMARY_METRICS:
        print(f"{name:28s}{summary['before'][name]:10.3f}{summary['after'][name]:10.3f}")
    print(f"{'rollout tokens/s':28s}{summary['rollout_tokens_per_s']:20,.0f}")
    print(f"{'update tokens/s':28s}{summary['update_tokens_per_s']:20,.0f}")
    print(f"{'wall time':28s}{summary['wall_time_s'] / 60:17.1f} min")


def _plot(path: pathlib.Path, rows: list[dict], validations: list[dict], env: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no {path.name}: pip install matplotlib, or rllib_ragen[plots])")
        return
    success = M.env_metric(env, M.SUCCESS)
    panels = [(TRAINING + success, "training success"), (M.FILTER_REWARD_STD, "in-group reward std"),
              (LEARNER + M.ENTROPY, "entropy"), (LEARNER + M.GRAD_NORM.format(optimizer="actor"), "actor grad norm")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3))
    steps = [r["training_iteration"] for r in rows]
    for ax, (key, title) in zip(axes, panels):
        ax.plot(steps, [r.get(key, math.nan) for r in rows], marker=".")
        ax.set_title(title)
        ax.set_xlabel("iteration")
    axes[0].plot([v[VALIDATED_AT] for v in validations], [v.get(VALIDATION + success) for v in validations],
                 "s", color="tab:red", label="validation (held out)")
    axes[0].legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
