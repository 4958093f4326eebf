"""One-step off-policy rollouts against synchronous ones: iterations per minute and learning, in the same run.

Builds the bandit main job's config (``tuned_examples/starpo_bandit.py``), warm-starts the tiny model once, then
trains it twice from that warm start for the same number of iterations, each with one remote env runner and the
learner in this process: ``max_policy_lag=0`` (rollout, then update) and ``max_policy_lag=1`` (the next rollout
plays on the env runner while the learner updates). Prints iterations per minute of each and their ratio, the mean
policy lag and importance weight, and both runs' validation success on the same validation states before and after
(paired), so a speed-up that costs learning shows.

    python benchmarks/async_rollouts.py [--iterations 12] [--env sokoban] [--runner-cpus 1] [--learner-threads 1]

``--env sokoban`` uses the Sokoban job's config instead (multi-turn; its warm start takes a few minutes).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402
from main_jobs import demonstration_policy, job_module  # noqa: E402  (benchmarks/)

from rllib_ragen.jobs.readers import state_of, trajectory_outcomes  # noqa: E402
from rllib_ragen.jobs.paired_stats import paired_comparison  # noqa: E402
from rllib_ragen.jobs.warm_start import warm_start  # noqa: E402

JOBS = {"bandit": "starpo_bandit.py", "sokoban": "starpo_sokoban.py"}


def train(config, iterations: int) -> dict:
    algo = config.build_algo()
    try:
        before = outcomes(algo)
        seconds, lags, weights = [], [], []
        for _ in range(iterations):
            t0 = time.perf_counter()
            result = algo.train()
            seconds.append(time.perf_counter() - t0)
            lags.append(result["rollout/policy_lag"])
            weights.append(result["learners"]["default_policy"].get("off_policy/importance_weight_mean", 1.0))
        return {
            "seconds": seconds,
            "lag": statistics.mean(lags),
            "weight": statistics.mean(weights),
            "before": before,
            "after": outcomes(algo),
        }
    finally:
        algo.stop()


def outcomes(algo) -> dict[str, float]:
    algo.evaluate_validation_set()
    return trajectory_outcomes(algo.last_validation)


def of_env(env: str, *runs_outcomes: dict) -> list[dict]:
    """Each of ``runs_outcomes`` restricted to ``env``'s validation states."""
    return [{key: value for key, value in o.items() if state_of(key)[0] == env} for o in runs_outcomes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(JOBS), default="bandit")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--runner-cpus", type=int, default=1, help="CPUs (torch threads) of the remote env runner")
    parser.add_argument("--learner-threads", type=int, default=1, help="torch threads of the learner (this process)")
    args = parser.parse_args()
    torch.set_num_threads(args.learner_threads)

    module = job_module(JOBS[args.env])
    config, job = module.config, module.job
    ray.init(num_cpus=args.runner_cpus + 1, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as folder:
        model = warm_start(config, job, demonstration_policy(config), pathlib.Path(folder) / "warm_start")
        runs = {}
        for lag in (0, 1):
            run_config = (
                config.copy(copy_frozen=False)
                .rl_module(model_config={"model": model})
                .training(validation_interval=0, max_policy_lag=lag)
                .env_runners(num_env_runners=1, num_cpus_per_env_runner=args.runner_cpus)
            )
            runs[lag] = train(run_config, args.iterations)
    ray.shutdown()

    sync, off = runs[0], runs[1]
    # The first iteration is synchronous in both (nothing to overlap yet) and pays for warm-up: timed apart.
    per_minute = {lag: 60 / statistics.mean(run["seconds"][1:]) for lag, run in runs.items()}
    print(
        f"{config.env}, {args.iterations} iterations each, one remote env runner ({args.runner_cpus} CPU), "
        f"learner in this process ({args.learner_threads} threads), {os.cpu_count()} cores"
    )
    print(f"{'':34s} {'synchronous':>12s} {'one-step off-policy':>20s}")
    print(f"{'iterations per minute (2nd on)':34s} {per_minute[0]:12.1f} {per_minute[1]:20.1f}")
    print(f"{'first iteration, s':34s} {sync['seconds'][0]:12.2f} {off['seconds'][0]:20.2f}")
    print(f"{'mean policy lag':34s} {sync['lag']:12.2f} {off['lag']:20.2f}")
    print(f"{'mean importance weight':34s} {sync['weight']:12.3f} {off['weight']:20.3f}")
    print(f"speed-up: {per_minute[1] / per_minute[0]:.2f}x iterations per minute")
    # Per validation environment: pooled, the bandit's variants (held-out names, reversed roles) would hide the
    # training bandit's gain.
    for env in sorted({state_of(key)[0] for key in sync["before"]}):
        print(env)
        for name, run in (("synchronous", sync), ("one-step off-policy", off)):
            comparison = paired_comparison(*of_env(env, run["before"], run["after"]))
            print(f"  validation, {name:20s}: {comparison.describe()}")
        print(
            f"  after, off-policy vs synchronous (same states): "
            f"{paired_comparison(*of_env(env, sync['after'], off['after'])).describe()}"
        )


if __name__ == "__main__":
    main()
