"""Which advantage estimator gives credit best across turns? gae, bi_level_gae, turn_gae, gigpo and grpo compared.

One study per environment where credit inside an episode matters, each reward placed on the turn that earned it
(``turn_level_rewards=True``):

- ``frozenlake``: the solid-ice 4x4 lake, up to 10 turns of one move each; reward 1 on reaching the goal.
- ``sokoban``: 6x6 one-box Sokoban, up to 5 turns of up to 5 moves, the reference's shaped reward (-0.1 per
  move, +1 box on target, +10 solved) on the turn that earned it.

Every estimator starts from the same warm start (the main job's, trained once per environment), trains with the
same seeds, settings and iteration budget, and plays the same held-out states before and after. The report pairs
each state's outcome before and after (95% interval, exact McNemar p) and each estimator against ``gae`` on the
same states. Results go to ``OUTPUT_DIR/<env>/``: ``before.json``, ``<estimator>/after.json`` (per-state outcomes
and the comparison), ``<estimator>/metrics.csv``, and ``results.md`` (the table). An estimator whose
``after.json`` exists is not trained again, so an interrupted study continues where it stopped.

    python tuned_examples/estimator_study.py --env frozenlake [--iterations 25] [--validation-size 512]
    python tuned_examples/estimator_study.py --env sokoban [--estimators gae,grpo] [--output-dir DIR]

On a 2-core CPU: FrozenLake ~40 min (warm start 10 min, ~6 min per estimator), Sokoban ~40 min (warm start 6-11
min, ~5.5 min per estimator). The README's FrozenLake table was measured with the job's earlier warm start (300
steps at lr 2e-3 on 1,000 demonstrations, float32, last weights) and RL rate (3e-4): ``--warm-start-steps 300
--warm-start-episodes 1000 --warm-start-lr 2e-3 --warm-start-average-decay 0 --warm-start-precision float32 --lr 3e-4``
reproduces it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import pathlib
import runpy
import sys
import time

import torch

from rllib_ragen import metrics as M
from rllib_ragen.experiment_outputs import LEARNER, TRAINING, result_row
from rllib_ragen.sft import warm_start
from rllib_ragen.experiment_outputs import (keep_notices_off_the_console, send_notices_to, trajectory_outcomes,
                                          write_text_atomically)
from rllib_ragen.experiment_flags import JobSettings, user_model_config
from rllib_ragen.paired_stats import paired_comparison
from rllib_ragen.rollout.scripted import frozen_lake_optimal_policy, sokoban_solver_policy

HERE = pathlib.Path(__file__).resolve().parent
ESTIMATORS = ("gae", "bi_level_gae", "turn_gae", "gigpo", "grpo")
BASELINE = "gae"
# The main job's warm-start settings a study may override; flags with JobSettings' own help texts.
WARM_START_FIELDS = ("warm_start_steps", "warm_start_episodes", "warm_start_lr", "warm_start_average_decay",
                     "warm_start_precision")
# environment -> (main job it takes its settings and warm start from, env_config, demonstration policy, iterations)
STUDIES = {
    "frozenlake": ("starpo_frozenlake", {}, lambda config: frozen_lake_optimal_policy(False, is_slippery=False), 25),
    "sokoban": ("starpo_sokoban", {"reward": "shaped"},
                lambda config: sokoban_solver_policy(config.max_actions_per_turn, config.enable_thinking), 40),
}


def study_config(env: str, validation_size: int):
    """The main job's config and settings, with per-turn rewards and validation only when the study asks."""
    job_file, env_config, _, _ = STUDIES[env]
    namespace = runpy.run_path(str(HERE / f"{job_file}.py"), run_name="estimator_study")
    config = namespace["config"].copy(copy_frozen=False)
    config.environment(config.env, env_config={**config.env_config, **env_config})
    config.training(turn_level_rewards=True, validation_size=validation_size, validation_interval=0)
    return config, namespace["job"]


def outcomes(algo) -> dict[str, float]:
    """Per held-out state of the last validation (``"<env>:<seed>"``), the share of its episodes solved."""
    return trajectory_outcomes(algo.last_validation)


def validate(config, model: str) -> dict[str, float]:
    algo = config.copy(copy_frozen=False).rl_module(
        model_config={**user_model_config(config), "model": model}).build_algo()
    try:
        algo.evaluate_validation_set()
        return outcomes(algo)
    finally:
        algo.stop()


def train_and_validate(config, model: str, estimator: str, iterations: int, folder: pathlib.Path) -> dict:
    """Train ``estimator`` from ``model`` for ``iterations``; write its metrics and return per-state outcomes."""
    config = config.copy(copy_frozen=False).training(advantage_estimator=estimator).rl_module(
        model_config={**user_model_config(config), "model": model})
    algo = config.build_algo()
    folder.mkdir(parents=True, exist_ok=True)
    columns = ("iteration", "success", "reward_std", "entropy", "grad_norm", "seconds")
    names = (TRAINING + M.env_metric(M.POOLED, M.SUCCESS), M.FILTER_REWARD_STD, LEARNER + M.ENTROPY,
             LEARNER + M.GRAD_NORM.format(optimizer="actor"))
    try:
        with open(folder / "metrics.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            for _ in range(iterations):
                t0 = time.perf_counter()
                result = result_row(algo.train())
                row = (algo.iteration, *(result.get(name, math.nan) for name in names), time.perf_counter() - t0)
                writer.writerow(row)
                f.flush()
                print(f"  {estimator} iter {algo.iteration:3d}/{iterations} | success {row[1]:.2f} | "
                      f"{row[5]:.1f} s", flush=True)
        algo.evaluate_validation_set()
        return outcomes(algo)
    finally:
        algo.stop()


def write_json(path: pathlib.Path, data) -> None:
    """Whole or not at all: a study killed mid-write must not leave a truncated result it would then trust."""
    write_text_atomically(path, json.dumps(data, indent=1))


def report(env: str, config, iterations: int, before: dict, afters: dict[str, dict]) -> str:
    lines = [f"{config.env}, {len(before)} held-out states, validation temperature {config.validation_temperature}, "
             f"{iterations} iterations from one warm start, per-turn rewards ({config.env_config or 'default'})",
             "", "| estimator | before | after | after - before [95% CI] | p | vs gae [95% CI] | p vs gae |",
             "|---|---|---|---|---|---|---|"]
    for estimator, after in afters.items():
        gain = paired_comparison(before, after)
        if estimator != BASELINE and BASELINE in afters:
            vs = paired_comparison(afters[BASELINE], after)
            vs_text = f"{vs.difference:+.3f} [{vs.ci_low:+.3f}, {vs.ci_high:+.3f}] | {vs.p_value:.2g}"
        else:
            vs_text = "- | -"
        lines.append(f"| {estimator} | {gain.before:.3f} | {gain.after:.3f} | {gain.difference:+.3f} "
                     f"[{gain.ci_low:+.3f}, {gain.ci_high:+.3f}] | {gain.p_value:.2g} | {vs_text} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(STUDIES), required=True)
    parser.add_argument("--estimators", default=",".join(ESTIMATORS),
                        help=f"comma-separated names from {', '.join(ESTIMATORS)}")
    parser.add_argument("--iterations", type=int, help="StarPO iterations per estimator (default: the study's)")
    parser.add_argument("--validation-size", type=int, default=512, help="held-out states played before and after")
    parser.add_argument("--output-dir", default="outputs/estimator_study")
    help_texts = {f.name: f.metadata["help"] for f in dataclasses.fields(JobSettings)}
    for name in WARM_START_FIELDS:
        parser.add_argument("--" + name.replace("_", "-"), type=type(getattr(JobSettings(), name)),
                            help=f"{help_texts[name]} (default: the job's)")
    parser.add_argument("--lr", type=float, help="the actor's RL learning rate (default: the job's)")
    args = parser.parse_args(argv)
    estimators = [name.strip() for name in args.estimators.split(",") if name.strip()]
    unknown = sorted(set(estimators) - set(ESTIMATORS))
    if unknown or not estimators:
        parser.error(f"--estimators: unknown {unknown}; choose from {', '.join(ESTIMATORS)}")
    if args.validation_size < 2:
        parser.error("--validation-size must be at least 2 (a paired comparison needs two states)")
    iterations = args.iterations or STUDIES[args.env][3]
    if iterations < 1:
        parser.error("--iterations must be >= 1")

    import ray

    keep_notices_off_the_console()  # library notices and loading bars go to the study's job.log
    config, job = study_config(args.env, args.validation_size)
    if args.lr is not None:
        config.training(lr=args.lr)
    for field in WARM_START_FIELDS:
        if getattr(args, field) is not None:
            setattr(job, field, getattr(args, field))
    try:
        config.validate()
        job.validate()
    except ValueError as error:
        parser.error(str(error))
    out = pathlib.Path(args.output_dir).resolve() / args.env
    out.mkdir(parents=True, exist_ok=True)
    print(f"estimator study on {config.env}: {', '.join(estimators)}; {iterations} iterations each; "
          f"{args.validation_size} held-out states; outputs in {out}", flush=True)
    torch.set_num_threads(job.threads or os.cpu_count() or 1)  # 0: every CPU
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    send_notices_to(out / "job.log")
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    keep_notices_off_the_console()
    try:
        warm_dir = out / "warm_start"
        if (warm_dir / "config.json").is_file():
            print(f"warm start: reusing {warm_dir}", flush=True)
        else:
            warm_start(config, job, STUDIES[args.env][2](config), warm_dir)
        model = str(warm_dir)
        before_path = out / "before.json"
        if not before_path.is_file():
            write_json(before_path, validate(config, model))
        before = json.loads(before_path.read_text())
        print(f"before: success {sum(before.values()) / len(before):.3f} on {len(before)} states", flush=True)
        afters = {}
        for estimator in estimators:
            after_path = out / estimator / "after.json"
            if after_path.is_file():
                afters[estimator] = json.loads(after_path.read_text())["outcomes"]
                print(f"{estimator}: reusing {after_path}", flush=True)
                continue
            t0 = time.perf_counter()
            after = train_and_validate(config, model, estimator, iterations, out / estimator)
            comparison = paired_comparison(before, after)
            write_json(after_path, {"estimator": estimator, "iterations": iterations, "outcomes": after,
                                    "vs_before": comparison.as_dict(), "seconds": time.perf_counter() - t0})
            afters[estimator] = after
            print(f"{estimator}: {comparison.describe()} ({time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        ray.shutdown()
    table = report(args.env, config, iterations, before, afters)
    (out / "results.md").write_text(table)
    print("\n" + table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
