"""The echo-trap probe's cost against the training iteration it rides on, measured in the same run.

Builds the Sokoban main job's config (``tuned_examples/starpo_sokoban.py``: 16 x 4 episodes, thinking replies of up
to 48 tokens, the top-25% filter), trains a few iterations without the probe, timing each, and after each one runs
the probe (cross-scoring ``collapse_subsample`` first-turn reasonings, the policy-gradient norm per reward-variance
bucket) on that iteration's rollout, timing it. Prints the probe's seconds, the iteration's, their ratio, and the
share of training time it costs at the default interval (target: under 10%).

    python benchmarks/collapse_probe.py [--model PATH] [--iterations 4] [--subsample 8] [--interval 5]

``--model`` defaults to the job's latest warm start (``outputs/starpo_sokoban/latest/warm_start``) when there is
one, else the untrained tiny model (whose replies run to the length limit: a pessimistic case for the probe).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402

from rllib_ragen.starpo.update_batch import prepare_update_batch  # noqa: E402

from main_jobs import ROOT, job_module  # noqa: E402  (benchmarks/)

JOB_WARM_START = ROOT / "outputs/starpo_sokoban/latest/warm_start"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    warm_start = (JOB_WARM_START / "config.json").is_file()
    parser.add_argument("--model", default=str(JOB_WARM_START) if warm_start else "tiny")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--subsample", type=int, default=8)
    parser.add_argument("--interval", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = (job_module("starpo_sokoban.py").config.copy(copy_frozen=False)
              .rl_module(model_config={"model": args.model})
              .training(validation_interval=0, collapse_diagnostics_interval=0, collapse_subsample=args.subsample))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    iteration_s, probe_s = [], []
    try:
        for i in range(args.iterations):
            t0 = time.perf_counter()
            algo.train()
            iteration_s.append(time.perf_counter() - t0)
            columns, _ = prepare_update_batch(algo.last_rollout, algo.config, algo._pad_token_id())
            t0 = time.perf_counter()
            probe = algo._collapse_probe(columns, algo.last_rollout)
            probe_s.append(time.perf_counter() - t0)
            print(f"iteration {i + 1}: {iteration_s[-1]:.1f} s; probe {probe_s[-1]:.2f} s (retrieval accuracy "
                  f"{probe.get('collapse/retrieval_accuracy', float('nan')):.2f}, MI estimate "
                  f"{probe.get('collapse/mi_estimate', float('nan')):.3f} nats)", flush=True)
    finally:
        algo.stop()
        ray.shutdown()
    # The first iteration carries one-off warm-up; leave it out when there are others.
    iteration = statistics.median(iteration_s[1:] or iteration_s)
    cost = statistics.median(probe_s[1:] or probe_s)
    print(f"\nmodel {args.model}, {config.num_groups} x {config.group_size} episodes, subsample {args.subsample}")
    print(f"training iteration (median, without the probe): {iteration:.2f} s")
    print(f"one probe (median):                             {cost:.2f} s = {cost / iteration:.1%} of an iteration")
    print(f"at collapse_diagnostics_interval={args.interval}:             {cost / (args.interval * iteration):.1%} "
          "of training time (target: under 10%)")


if __name__ == "__main__":
    main()
