"""Context windows on long episodes: time and memory per iteration of the full context against a window.

8x8 two-box Sokoban, up to 10 turns of one move, 8 groups x 4 episodes, every group trained (no filter) with
``gae``: each mode in a fresh process (so each has its own peak memory) builds StarPO on the same model and seed
and trains ``--iterations`` iterations. Reported per mode: seconds per iteration (rollout and update, the first
iteration left out as warm-up), learner rows and the tokens they hold (padded: rows x the longest), the longest row,
and the process's peak resident memory with its rise over the built algorithm's. Ratios are against ``full``,
measured in the same run.

    python benchmarks/context_windows.py [--iterations 4] [--model tiny] [--modes full,last_k_turns:2,single_turn]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(mode: str, iterations: int, model: str) -> dict:
    """One mode, in this process: build, train, and measure."""
    import ray
    import torch

    from rllib_ragen import StarPOConfig

    torch.set_num_threads(2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    window, _, turns = mode.partition(":")
    config = (
        StarPOConfig()
        .environment("rllib_ragen/Sokoban8x8TwoBoxes-v0")
        .rl_module(model_config={"model": model})
        .training(
            num_groups=8,
            group_size=4,
            rollout_filter="none",
            rollout_filter_ratio=1.0,
            max_turns=10,
            max_actions_per_turn=1,
            max_actions_per_episode=10,
            max_new_tokens_per_turn=48,
            max_context_tokens=8192,
            lr=1e-4,
            critic_lr=1e-3,
            validation_interval=0,
            validate_before_training=False,
            collapse_diagnostics_interval=0,
            context_window=window,
            context_window_turns=int(turns) if turns else None,
        )
        .debugging(seed=0)
    )
    algo = config.build_algo()
    built = peak_rss_mib()
    per_iteration = []
    try:
        for _ in range(iterations):
            t0 = time.perf_counter()
            result = algo.train()
            kept = algo.last_rollout
            rows = [s.token_ids for t in kept for s in t.turn_samples] or [t.token_ids for t in kept]
            per_iteration.append(
                {
                    "seconds": time.perf_counter() - t0,
                    "rollout_s": result["time/sample_s"],
                    "update_s": result["time/update_s"],
                    "rows": len(rows),
                    "padded_tokens": len(rows) * max(map(len, rows)),
                    "longest_row": max(map(len, rows)),
                    "turns": sum(t.num_turns for t in kept),
                }
            )
    finally:
        algo.stop()
        ray.shutdown()
    timed = per_iteration[1:] or per_iteration
    return {
        "mode": mode,
        "peak_rss_mib": peak_rss_mib(),
        "built_rss_mib": built,
        **{key: statistics.mean(it[key] for it in timed) for key in timed[0]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--modes", default="full,last_k_turns:2,single_turn")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a worker process: measure one mode, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.iterations, args.model)))
        return
    results = []
    for mode in args.modes.split(","):
        done = subprocess.run(
            [sys.executable, __file__, "--one", mode, "--iterations", str(args.iterations), "--model", args.model],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = results[0]
    print(
        f"8x8 two-box Sokoban, 10 turns, 32 episodes an iteration, model {args.model}; means of iterations "
        f"2-{args.iterations}; ratio: against {base['mode']}"
    )
    print(
        f"{'mode':16s}{'s/iter':>8s}{'rollout s':>10s}{'update s':>9s}{'rows':>6s}{'turns':>7s}{'padded tok':>11s}"
        f"{'longest':>8s}{'peak MiB':>9s}{'rise MiB':>9s}  ratios (iteration, update, padded tokens, rise)"
    )
    for r in results:
        rise, base_rise = r["peak_rss_mib"] - r["built_rss_mib"], base["peak_rss_mib"] - base["built_rss_mib"]
        print(
            f"{r['mode']:16s}{r['seconds']:8.1f}{r['rollout_s']:10.1f}{r['update_s']:9.2f}{r['rows']:6.0f}"
            f"{r['turns']:7.0f}{r['padded_tokens']:11,.0f}{r['longest_row']:8.0f}{r['peak_rss_mib']:9.0f}"
            f"{rise:9.0f}  {r['seconds'] / base['seconds']:.2f} {r['update_s'] / base['update_s']:.2f} "
            f"{r['padded_tokens'] / base['padded_tokens']:.2f} {rise / max(base_rise, 1):.2f}"
        )


if __name__ == "__main__":
    main()
