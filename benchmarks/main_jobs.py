"""The main jobs' configs and demonstration policies, for benchmarks that measure on a job's own setting."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def job_module(file_name: str):
    """``tuned_examples/<file_name>`` as a module: its ``config`` and ``job``; runs nothing (the job runs under
    ``__main__``)."""
    spec = importlib.util.spec_from_file_location(f"job_{pathlib.Path(file_name).stem}",
                                                  ROOT / "tuned_examples" / file_name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demonstration_policy(config):
    """The job's own demonstrations (its ``__main__`` block passes the same policy to ``run_job``)."""
    import gymnasium as gym

    from rllib_ragen.rollout import scripted

    if config.env.endswith("Bandit-v0"):
        return scripted.random_arm_policy(seed=config.seed, enable_thinking=config.enable_thinking)
    if "FrozenLake" in config.env:
        slippery = gym.make(config.env, **config.env_config).unwrapped.is_slippery
        return scripted.frozen_lake_optimal_policy(config.enable_thinking, is_slippery=slippery)
    return scripted.sokoban_solver_policy(config.max_actions_per_turn, config.enable_thinking)
