"""One StarPO iteration of SmolLM2-135M on FrozenLake under the ``smollm2-cpu`` preset, timed phase by phase, beside
the same iteration as the release before this preset could run it.

The FrozenLake job's config with ``--preset smollm2-cpu`` (8 groups of 4 episodes, LoRA r = 16, mean-only GRPO,
micro-batches of 4, the sampler and the learner's passes in bfloat16 where the CPU computes it natively), started
from a saved warm start so that both sides play the same policy. ``--baseline`` builds the same iteration from the
settings the release before had (every one of these but the bfloat16 sampler, which it did not have: it sampled in
float32 and updated in float32); run it from a checkout of that release (``PYTHONPATH=<checkout>``) to measure what
an iteration cost there. The peak RSS is this process's (the job's trial process: learner and sampler together).

    python benchmarks/smollm2_iteration.py --model outputs/starpo_frozenlake/warm_starts/<key> [--iterations 4]
    PYTHONPATH=<checkout of the release before> python benchmarks/smollm2_iteration.py --model ... --baseline
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from main_jobs import job_module  # noqa: E402


def build_config(model: str, baseline: bool):
    """The FrozenLake job's config for ``model``: under the preset, or (``baseline``) under the same settings spelt
    out without the settings this preset added."""
    config = job_module("starpo_frozenlake.py").config.copy(copy_frozen=False)
    if baseline:
        config.training(lr=1e-4, advantage_estimator="grpo", grpo_normalize_std=False, group_size=4,
                        micro_batch_size=4, validation_interval=0)
        config.rl_module(model_config={"model": model, "lora": {"r": 16}})
    else:
        config.preset("smollm2-cpu")
        config.rl_module(model_config={**config.model_config, "model": model})
    # No validation: the iteration alone (the job validates before and after RL, not every iteration).
    return config.training(validation_interval=0, validate_before_training=False).env_runners(num_env_runners=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a saved warm start of SmolLM2 (the job's warm_starts/<key>)")
    parser.add_argument("--iterations", type=int, default=4, help="timed after one untimed iteration")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", action="store_true", help="the settings of the release before (see above)")
    args = parser.parse_args()

    import ray
    import torch

    import rllib_ragen

    torch.set_num_threads(args.threads)
    ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    config = build_config(args.model, args.baseline)
    print(f"rllib_ragen from {os.path.dirname(rllib_ragen.__file__)}; "
          f"{'baseline (the release before: float32)' if args.baseline else 'the smollm2-cpu preset'}; "
          f"sampler {getattr(config, 'rollout_dtype', None) or 'float32'}, "
          f"learner {config.autocast_dtype or 'float32'}")
    algo = config.build_algo()
    rows = []
    for iteration in range(args.iterations + 1):
        start = time.perf_counter()
        result = algo.train()
        wall = time.perf_counter() - start
        learner = result["learners"]["default_policy"]
        row = {"wall": wall, "sample": result["time/sample_s"], "update": result["time/update_s"],
               "update tokens/s": learner["perf/update_tokens_per_s"]}
        print(f"iteration {iteration + 1}{' (untimed)' if iteration == 0 else ''}: "
              + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
        if iteration:
            rows.append(row)
    algo.stop()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"median of {len(rows)}: " + ", ".join(f"{k} {statistics.median(r[k] for r in rows):.1f}"
                                                  for k in ("wall", "sample", "update", "update tokens/s"))
          + f" s; peak RSS {peak:.2f} GiB")


if __name__ == "__main__":
    main()
