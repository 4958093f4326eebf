"""The echo trap, watched: vanilla StarPO and StarPO-S from one warm start, side by side, diagnostics against
validation success, and the sentinel's firings (in warn mode, so both runs go their whole way).

One warm start (the bandit job's: random-arm demonstrations), then each variant trains ``--iterations`` iterations
with the echo-trap probe and validation at every iteration. A variant's validation success "falls" at the first
validation ``--fall`` below its best so far; the sentinel's lead time is that iteration minus the first firing's.
Writes ``echo_trap.png`` (one column per variant: validation success, in-group reward std, entropy, grad norm, MI
estimate, repeat rate; sentinel firings as red lines, the fall as a black dashed one), ``results.md`` and each
variant's ``metrics.csv`` and ``sentinel.json``.

    python tuned_examples/echo_trap.py [--iterations 20] [--lr 5e-3] [--output-dir outputs/echo_trap]

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
from rllib_ragen.experiment import JobSettings, flatten_result, warm_start
from rllib_ragen.experiment_outputs import (LEARNER, TRAINING, VALIDATION, keep_notices_off_the_console, write_csv,
                                            write_text_atomically)
from rllib_ragen.rollout.scripted import random_arm_policy
from rllib_ragen.sentinel import echo_trap_rules

ENV = "rllib_ragen/Bandit-v0"
VARIANTS = ("starpo", "starpo-s")  # presets: vanilla (KL, symmetric clip, no filter) and StarPO-S
SIGNALS = (("validation success", VALIDATION + M.env_metric(ENV, M.SUCCESS)),
           ("in-group reward std", M.FILTER_REWARD_STD),
           ("entropy", LEARNER + M.ENTROPY),
           ("actor grad norm", LEARNER + M.GRAD_NORM.format(optimizer="actor")),
           ("MI estimate (nats)", M.MI_ESTIMATE),
           ("repeat rate", M.REPEAT_RATE))


def base_config(lr: float, seed: int) -> StarPOConfig:
    return (StarPOConfig().environment(ENV)
            .training(num_groups=8, group_size=8, lr=lr, critic_lr=1e-3, max_turns=1, max_new_tokens_per_turn=32,
                      whiten_advantages=False, validation_size=128, validation_interval=1,
                      collapse_diagnostics_interval=1, sentinel_rules=echo_trap_rules("warn"))
            .debugging(seed=seed))


def train_variant(config: StarPOConfig, iterations: int, out: pathlib.Path) -> tuple[list[dict], list[dict]]:
    out.mkdir(parents=True, exist_ok=True)
    algo = config.build_algo()
    rows = []
    try:
        for _ in range(iterations):
            row = flatten_result(algo.train())
            rows.append(row)
            print(f"  {out.name} iteration {algo.iteration}: validation "
                  f"{row.get(SIGNALS[0][1], math.nan):.3f}, reward std {row.get(M.FILTER_REWARD_STD, math.nan):.3f}"
                  f", entropy {row.get(LEARNER + M.ENTROPY, math.nan):.3f}, MI {row.get(M.MI_ESTIMATE, math.nan):.3f}",
                  flush=True)
            write_csv(out / "metrics.csv", rows)
        firings = [dataclasses.asdict(f) for f in algo.sentinel.firings]
        write_text_atomically(out / "sentinel.json", json.dumps(firings, indent=2))
        return rows, firings
    finally:
        algo.stop()


def validation_fall(rows: list[dict], drop: float) -> int | None:
    """The first iteration whose validation success is ``drop`` or more below the best before it (None: never)."""
    best = -math.inf
    for row in rows:
        value = row.get(SIGNALS[0][1], math.nan)
        if math.isfinite(value):
            if value <= best - drop:
                return int(row["training_iteration"])
            best = max(best, value)
    return None


def plot(path: pathlib.Path, runs: dict, falls: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(SIGNALS), len(runs), figsize=(5 * len(runs), 2.0 * len(SIGNALS)), sharex=True,
                             squeeze=False)
    for column, (variant, (rows, firings)) in enumerate(runs.items()):
        its = [r["training_iteration"] for r in rows]
        for line, (name, key) in enumerate(SIGNALS):
            ax = axes[line][column]
            ax.plot(its, [r.get(key, math.nan) for r in rows], marker=".", color="#1f5fa8")
            for f in firings:
                ax.axvline(f["iteration"], color="#c22", lw=1, alpha=0.7)
            if falls[variant] is not None:
                ax.axvline(falls[variant], color="black", ls="--", lw=1)
            ax.set_ylabel(name, fontsize=8)
            if line == 0:
                ax.set_title(f"{variant}: sentinel firings (red), validation fall (dashed)", fontsize=9)
        axes[-1][column].set_xlabel("iteration")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--lr", type=float, default=5e-3, help="the actor's learning rate of both variants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fall", type=float, default=0.10, help="validation drop below its best that counts as "
                                                                  "a fall")
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
    config = base_config(args.lr, args.seed)
    job = JobSettings(warm_start_episodes=256, warm_start_steps=60)
    model = out / "warm_start"
    if not (model / "config.json").is_file():
        warm_start(config, job, random_arm_policy(seed=args.seed), model)
    runs, falls = {}, {}
    try:
        for variant in VARIANTS:
            variant_config = (config.copy(copy_frozen=False).preset(variant).training(lr=args.lr)
                              .rl_module(model_config={"model": str(model)}))
            runs[variant] = train_variant(variant_config, args.iterations, out / variant)
            falls[variant] = validation_fall(runs[variant][0], args.fall)
    finally:
        ray.shutdown()
    lines = ["| variant | validation: first / best / last | falls at | first firing (rule) | lead (iterations) |",
             "|---|---|---|---|---|"]
    for variant, (rows, firings) in runs.items():
        values = [r[SIGNALS[0][1]] for r in rows if math.isfinite(r.get(SIGNALS[0][1], math.nan))]
        first = firings[0] if firings else None
        lead = (falls[variant] - first["iteration"]) if first and falls[variant] is not None else None
        fired = f"{first['iteration']} ({first['rule']})" if first else "never"
        lines.append(f"| {variant} | {values[0]:.3f} / {max(values):.3f} / {values[-1]:.3f} | "
                     f"{falls[variant] or 'never'} | {fired} | {lead if lead is not None else '-'} |")
    title = f"{ENV}, tiny model, lr {args.lr:g}, seed {args.seed}, {args.iterations} iterations from one warm start"
    plot(out / "echo_trap.png", runs, falls, title)
    table = "\n".join(lines)
    write_text_atomically(out / "results.md", f"# Echo trap: {title}\n\n{table}\n")
    print(f"\n{table}\n\nwrote {out / 'echo_trap.png'} and {out / 'results.md'} ({(time.perf_counter() - t0) / 60:.1f} "
          "min)")


if __name__ == "__main__":
    main()
