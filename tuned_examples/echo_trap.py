"""The echo trap, watched: vanilla StarPO and StarPO-S from one warm start, side by side, diagnostics against
validation success, and the sentinel's firings (in warn mode, so both runs go their whole way).

One warm start (the main job's: ``--env bandit``, random-arm demonstrations, or ``--env sokoban``, the solver's),
then each variant trains ``--iterations`` iterations with the echo-trap probe and validation at every iteration
(``--action rollback`` lets the sentinel act; its outputs are suffixed ``_rollback``). A variant "collapses" at
the first validation from which its success stays ``--fall`` below its best so far to the end of the run; the
sentinel's lead time is that iteration minus the first firing's.
Writes ``echo_trap.png`` (one column per variant: validation success, in-group reward std, entropy, grad norm, MI
estimate, repeat rate; sentinel firings as red lines, the fall as a black dashed one), ``results.md`` and each
variant's ``metrics.csv`` and ``sentinel.json``.

    python tuned_examples/echo_trap.py [--env bandit] [--iterations 20] [--lr 5e-3] [--seed 0] [--output-dir DIR]

The default learning rate is ten times the bandit job's: the point is to see a collapse, and what comes first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import time

import torch

from rllib_ragen import StarPOConfig
from rllib_ragen import metrics as M
from rllib_ragen.experiment_flags import JobSettings
from rllib_ragen.experiment_outputs import result_row
from rllib_ragen.sft import warm_start
from rllib_ragen.experiment_outputs import (LEARNER, VALIDATION, keep_notices_off_the_console, write_csv,
                                            write_text_atomically)
from rllib_ragen.rollout.scripted import random_arm_policy, sokoban_solver_policy
from rllib_ragen.sentinel import echo_trap_rules

VARIANTS = ("starpo", "starpo-s")  # presets: vanilla (KL, symmetric clip, no filter) and StarPO-S
SUCCESS = "validation success"
SIGNALS = ((SUCCESS, None),  # the environment's validation success: see success_key
           ("in-group reward std", M.FILTER_REWARD_STD),
           ("entropy", LEARNER + M.ENTROPY),
           ("actor grad norm", LEARNER + M.GRAD_NORM.format(optimizer="actor")),
           ("MI estimate (nats)", M.MI_ESTIMATE),
           ("repeat rate", M.REPEAT_RATE))


# Each environment's setup: the main job's config and warm start, validation every iteration.
SETUPS = {
    "bandit": dict(env="rllib_ragen/Bandit-v0", env_config={}, warm_start_episodes=256, warm_start_steps=60,
                   training=dict(num_groups=8, group_size=8, max_turns=1, max_new_tokens_per_turn=32),
                   demonstrations=lambda seed: random_arm_policy(seed=seed)),
    "sokoban": dict(env="rllib_ragen/Sokoban-v0", env_config={"reward": "success"}, warm_start_episodes=2000,
                    warm_start_steps=500, training=dict(num_groups=16, group_size=4, max_new_tokens_per_turn=48),
                    demonstrations=lambda seed: sokoban_solver_policy()),
}


def base_config(setup: dict, lr: float, seed: int, validation_size: int, action: str) -> StarPOConfig:
    return (StarPOConfig().environment(setup["env"], env_config=setup["env_config"])
            .training(**setup["training"], lr=lr, critic_lr=1e-3, whiten_advantages=False,
                      validation_size=validation_size, validation_interval=1,
                      validate_before_training=False,  # played by train_variant, as iteration 0
                      collapse_diagnostics_interval=1, sentinel_rules=echo_trap_rules(action))
            .debugging(seed=seed))


def success_key(env: str) -> str:
    return VALIDATION + M.env_metric(env, M.SUCCESS)


def train_variant(config: StarPOConfig, iterations: int, out: pathlib.Path) -> tuple[list[dict], list[dict]]:
    out.mkdir(parents=True, exist_ok=True)
    algo = config.build_algo()
    try:
        # The warm start's score first (iteration 0), so a fall from it counts.
        rows = [{**result_row({"evaluation": {"env_runners": algo.evaluate_validation_set()}}),
                 "training_iteration": 0}]
        for _ in range(iterations):
            row = result_row(algo.train())
            rows.append(row)
            shown = {"validation": success_key(config.env), "reward std": M.FILTER_REWARD_STD,
                     "entropy": LEARNER + M.ENTROPY, "MI": M.MI_ESTIMATE}
            print(f"  {out.name} iteration {algo.iteration}: "
                  + ", ".join(f"{name} {row.get(key, math.nan):.3f}" for name, key in shown.items()), flush=True)
            write_csv(out / "metrics.csv", rows)
        firings = [dataclasses.asdict(f) for f in algo.sentinel.firings]
        write_text_atomically(out / "sentinel.json", json.dumps(firings, indent=2))
        return rows, firings
    finally:
        algo.stop()


def validation_fall(rows: list[dict], env: str, drop: float) -> int | None:
    """The iteration a collapse began: the first from which validation success stays ``drop`` or more below the
    best it reached before, to the end of the run (a dip it recovers from is not a collapse). None: no collapse."""
    points = [(int(r["training_iteration"]), r[success_key(env)]) for r in rows
              if math.isfinite(r.get(success_key(env), math.nan))]
    for index in range(1, len(points)):
        best_before = max(value for _, value in points[:index])
        if all(value <= best_before - drop for _, value in points[index:]):
            return points[index][0]
    return None


def plot(path: pathlib.Path, runs: dict, falls: dict, env: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(SIGNALS), len(runs), figsize=(5 * len(runs), 2.0 * len(SIGNALS)), sharex=True,
                             squeeze=False)
    for column, (variant, (rows, firings)) in enumerate(runs.items()):
        its = [r["training_iteration"] for r in rows]  # 0: the warm start (validation only)
        for line, (name, key) in enumerate(SIGNALS):
            ax = axes[line][column]
            ax.plot(its, [r.get(key or success_key(env), math.nan) for r in rows], marker=".", color="#1f5fa8")
            for f in firings:
                ax.axvline(f["iteration"], color="#c22", lw=1, alpha=0.7)
            if falls[variant] is not None:
                ax.axvline(falls[variant], color="black", ls="--", lw=1)
            ax.set_ylabel(name, fontsize=8)
            if line == 0:
                ax.set_title(f"{variant}: sentinel firings (red), collapse (dashed)", fontsize=9)
        axes[-1][column].set_xlabel("iteration")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(SETUPS), default="bandit")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--lr", type=float, default=5e-3, help="the actor's learning rate of both variants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fall", type=float, default=0.10, help="a lasting validation drop below its best this "
                                                                  "large is a collapse")
    parser.add_argument("--validation-size", type=int, default=128)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated presets to train")
    parser.add_argument("--action", choices=("warn", "rollback", "stop"), default="warn",
                        help="what the sentinel's rules do (warn: watch only); other than warn, a variant's folder "
                             "is named <variant>_<action>")
    parser.add_argument("--warm-start-steps", type=int, default=None, help="(default: the main job's)")
    parser.add_argument("--output-dir", default="outputs/echo_trap")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out = pathlib.Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    keep_notices_off_the_console()
    import ray

    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=2)
    t0 = time.perf_counter()
    setup = SETUPS[args.env]
    config = base_config(setup, args.lr, args.seed, args.validation_size, args.action)
    steps = setup["warm_start_steps"] if args.warm_start_steps is None else args.warm_start_steps
    job = JobSettings(warm_start_episodes=setup["warm_start_episodes"], warm_start_steps=steps)
    model = out / "warm_start"
    if not (model / "config.json").is_file():
        warm_start(config, job, setup["demonstrations"](args.seed), model)
    runs, falls = {}, {}
    try:
        for variant in args.variants.split(","):
            variant_config = (config.copy(copy_frozen=False).preset(variant).training(lr=args.lr)
                              .rl_module(model_config={"model": str(model)}))
            folder = variant if args.action == "warn" else f"{variant}_{args.action}"
            runs[variant] = train_variant(variant_config, args.iterations, out / folder)
            falls[variant] = validation_fall(runs[variant][0], config.env, args.fall)
    finally:
        ray.shutdown()
    lines = ["| variant | validation: first / best / last | collapse from | first firing (rule) | lead (iterations) |",
             "|---|---|---|---|---|"]
    for variant, (rows, firings) in runs.items():
        values = [r[success_key(config.env)] for r in rows if math.isfinite(r.get(success_key(config.env), math.nan))]
        first = firings[0] if firings else None
        lead = (falls[variant] - first["iteration"]) if first and falls[variant] is not None else None
        fired = f"{first['iteration']} ({first['rule']})" if first else "never"
        lines.append(f"| {variant} | {values[0]:.3f} / {max(values):.3f} / {values[-1]:.3f} | "
                     f"{falls[variant] or 'never'} | {fired} | {lead if lead is not None else '-'} |")
    title = (f"{config.env}, tiny model, lr {args.lr:g}, seed {args.seed}, {args.iterations} iterations from one "
             f"warm start, sentinel: {args.action}")
    suffix = "" if args.action == "warn" else f"_{args.action}"
    plot(out / f"echo_trap{suffix}.png", runs, falls, config.env, title)
    table = "\n".join(lines)
    write_text_atomically(out / f"results{suffix}.md", f"# Echo trap: {title}\n\n{table}\n")
    print(f"\n{table}\n\nwrote {out / f'echo_trap{suffix}.png'} and {out / f'results{suffix}.md'} "
          f"({(time.perf_counter() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
