"""Environment throughput: Sokoban levels generated per second, solver time per level, env steps per second.

Baseline measured in the same run: gymnasium's own FrozenLake-v1 (integer observations), to show what the
text layer (rendering the state as a string each step) costs on top of the same dynamics.

    python benchmarks/envs.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import rllib_ragen
from rllib_ragen.envs import generate_level, solve_level


def rate(fn, seconds: float) -> float:
    """Calls of ``fn`` per second over about ``seconds``."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        calls += 1
    return calls / elapsed


def steps_per_second(env_id: str, seconds: float, **kwargs) -> float:
    env, rng = gym.make(env_id, **kwargs), np.random.default_rng(0)
    actions = list(env.unwrapped.action_names) if hasattr(env.unwrapped, "action_names") else list(range(4))
    seed = iter(range(10**9))
    env.reset(seed=next(seed))

    def step():
        _, _, terminated, truncated, _ = env.step(actions[rng.integers(len(actions))])
        if terminated or truncated:
            env.reset(seed=next(seed))

    return rate(step, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    args = parser.parse_args()

    print("Sokoban level generation and solving")
    for dim, boxes in [(6, 1), (8, 2)]:
        seeds = iter(range(10**9))
        levels = []
        gen = rate(lambda: levels.append(generate_level(np.random.default_rng(next(seeds)), dim, boxes)), args.seconds)
        start = time.perf_counter()
        lengths = [len(solve_level(level)) for level in levels[:2000]]
        solve_ms = (time.perf_counter() - start) / len(lengths) * 1e3
        print(
            f"  {dim}x{dim}, {boxes} box(es): {gen:8.0f} levels/s   solver {solve_ms:.3f} ms/level   "
            f"optimal length mean {np.mean(lengths):.2f} (max {max(lengths)})"
        )

    print("Env steps per second (random actions, resets included)")
    baseline = steps_per_second("FrozenLake-v1", args.seconds, is_slippery=True)
    print(f"  {'FrozenLake-v1 (gymnasium, baseline)':40s} {baseline:9.0f} steps/s")
    for env_id in rllib_ragen.registered_text_envs():
        sps = steps_per_second(env_id, args.seconds)
        extra = f"   {sps / baseline:.2f}x baseline" if "FrozenLake" in env_id else ""
        print(f"  {env_id:40s} {sps:9.0f} steps/s{extra}")


if __name__ == "__main__":
    main()
