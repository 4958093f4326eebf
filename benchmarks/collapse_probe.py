"""The echo-trap probe's cost against the training iteration it rides on, measured in the same run.

Builds the Sokoban main job's config (``tuned_examples/starpo_sokoban.py``: 16 x 4 episodes, thinking replies of up
to 48 tokens, the top-25% filter), trains a few iterations without the probe, timing each, and after each one runs
the probe twice on that iteration's rollout, timing each: as it runs every ``collapse_diagnostics_interval``
iterations (cross-scoring ``collapse_subsample`` first-turn reasonings, the buckets' shares, the batch's
advantages for the rollout viewer), and with the policy-gradient norm per reward-variance bucket that it adds every
``gradient_analysis_interval`` iterations. Prints both probes' seconds, the iteration's, their ratios, and the share
of training time the probe costs at the given intervals (target: under 5%, the GPU-speed work's).

    python benchmarks/collapse_probe.py [--model PATH] [--iterations 4] [--subsample 8] [--interval 5]
        [--gradient-interval 50]

``--model`` defaults to the job's newest cached warm start (``outputs/starpo_sokoban/warm_starts/<key>/``, which
``python tuned_examples/starpo_sokoban.py --quick`` trains) when there is one, else the untrained tiny model (whose
replies run to the length limit: a pessimistic case for the probe). It prints which it used.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402

from rllib_ragen.starpo.policies import policy_batches  # noqa: E402

from rllib_ragen.collapse import probe_schedule  # noqa: E402
from rllib_ragen.jobs.warm_start import WARM_STARTS  # noqa: E402

from main_jobs import ROOT, job_module  # noqa: E402  (benchmarks/)


def newest_job_warm_start() -> str | None:
    """The Sokoban job's most recently trained warm start in its default output folder, or None."""
    models = [p.parent for p in (ROOT / "outputs/starpo_sokoban" / WARM_STARTS).glob("*/config.json")]
    return str(max(models, key=lambda p: p.stat().st_mtime)) if models else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=newest_job_warm_start() or "tiny")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--subsample", type=int, default=8)
    parser.add_argument("--interval", type=int, default=5, help="collapse_diagnostics_interval")
    parser.add_argument("--gradient-interval", type=int, default=50, help="gradient_analysis_interval")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = (
        job_module("starpo_sokoban.py")
        .config.copy(copy_frozen=False)
        .rl_module(model_config={"model": args.model})
        .training(validation_interval=0, collapse_diagnostics_interval=0, collapse_subsample=args.subsample)
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    iteration_s, cross_s, both_s = [], [], []
    try:
        for i in range(args.iterations):
            t0 = time.perf_counter()
            algo.train()
            iteration_s.append(time.perf_counter() - t0)
            batches, _ = policy_batches(algo.last_rollout, algo.config, algo._pad_token_id())
            t0 = time.perf_counter()
            probe = algo._collapse_probe(batches, algo.last_rollout, gradient_norms=False)
            cross_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            algo._collapse_probe(batches, algo.last_rollout, gradient_norms=True)
            both_s.append(time.perf_counter() - t0)
            print(
                f"iteration {i + 1}: {iteration_s[-1]:.1f} s; probe {cross_s[-1]:.2f} s, with the gradient norms "
                f"{both_s[-1]:.2f} s (retrieval accuracy {probe.get('collapse/retrieval_accuracy', math.nan):.2f}, "
                f"MI estimate {probe.get('collapse/mi_estimate', math.nan):.3f} nats)",
                flush=True,
            )
    finally:
        algo.stop()
        ray.shutdown()
    # The first iteration carries one-off warm-up; leave it out when there are others.
    iteration, cross, both = (statistics.median(s[1:] or s) for s in (iteration_s, cross_s, both_s))
    # The schedule over one full cycle of both intervals, as StarPO runs it.
    cycle = math.lcm(args.interval or 1, args.gradient_interval or 1)
    runs = [probe_schedule(i, args.interval, args.gradient_interval) for i in range(cycle)]
    probe_seconds = sum(both if gradients else cross for probe, gradients in runs if probe)
    print(f"\nmodel {args.model}, {config.num_groups} x {config.group_size} episodes, subsample {args.subsample}")
    print(f"training iteration (median, without the probe): {iteration:.2f} s")
    print(f"probe (median):                                 {cross:.2f} s = {cross / iteration:.1%} of an iteration")
    print(f"probe with the gradient norms (median):         {both:.2f} s = {both / iteration:.1%} of an iteration")
    print(
        f"at collapse_diagnostics_interval={args.interval}, gradient_analysis_interval={args.gradient_interval}: "
        f"{probe_seconds / (cycle * iteration):.1%} of training time (target: under 5%)"
    )
    if args.interval:
        print(
            f"the whole probe every {args.interval} iterations (before gradient_analysis_interval): "
            f"{both / (args.interval * iteration):.1%} of training time"
        )


if __name__ == "__main__":
    main()
