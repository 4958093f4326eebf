"""``benchmarks/rollout.py`` runs on every built-in environment: the model's rollouts, the two KV caches (which must
sample the same tokens) and the scripted player, each against the naive loop."""

import pathlib
import runpy
import sys

import gymnasium as gym
import pytest

import rllib_ragen  # noqa: F401

BENCHMARK = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "rollout.py"
BUILT_IN = sorted(name for name in gym.registry if name.startswith("rllib_ragen/"))


def test_the_built_in_environments_are_the_ones_the_benchmark_is_run_on():
    assert len(BUILT_IN) >= 12 and "rllib_ragen/FrozenLake-v0" in BUILT_IN


@pytest.mark.parametrize("env", BUILT_IN)
def test_the_rollout_benchmark_runs_on_every_built_in_environment(env, monkeypatch, capsys):
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "rollout.py",
            "--env",
            env,
            "--groups",
            "1",
            "--group-size",
            "2",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "8",
            "--repeats",
            "1",
            "--threads",
            "1",
        ],
    )
    runpy.run_path(str(BENCHMARK), run_name="__main__")
    printed = capsys.readouterr().out
    assert printed.count("engine / naive:") == 2 and "no model" in printed
