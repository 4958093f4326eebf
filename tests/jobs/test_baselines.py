"""Scripted baselines a job pairs its agent against (``run_job``'s ``baselines``): played on the validation states
in the agent's own loop, filed by name."""

import gymnasium as gym
import pytest

import rllib_ragen  # noqa: F401  (registers the environments)
from rllib_ragen import StarPOConfig
from rllib_ragen.envs.frozen_lake import optimal_policy
from rllib_ragen import StarPO
from rllib_ragen.jobs.run import JobSettings, run_job
from rllib_ragen.jobs.outputs import baseline_file
from rllib_ragen.rollout.tiny_model import build_tiny_tokenizer
from rllib_ragen.demonstrators import frozen_lake_hole_blind_policy

SOLID_ICE = "rllib_ragen/FrozenLakeNotSlippery-v0"


def hole_blind_walk(seed: int, budget: int) -> bool:
    """Read the map from the environment itself (not from the prompt), plan as if its holes were ice, walk the plan
    on the real map: whether it reaches the goal within ``budget`` moves."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    env = gym.make(SOLID_ICE).unwrapped
    env.reset(seed=seed)
    rows = ["".join(cell.decode() for cell in row) for row in env.lake.desc]
    size = len(rows)
    blind = FrozenLakeEnv(desc=[row.replace("H", "F") for row in rows], is_slippery=False)
    _, actions = optimal_policy(blind.P, size * size, budget)
    real, state = FrozenLakeEnv(desc=rows, is_slippery=False).P, env.position
    for moves_left in range(budget, 0, -1):
        ((_, state, reward, done),) = real[state][int(actions[moves_left, state])]
        if done:
            return reward > 0
    return False


def test_a_baseline_plays_the_validation_states_in_the_agents_loop():
    config = (
        StarPOConfig()
        .environment(SOLID_ICE)
        .training(
            enable_thinking=False, max_turns=10, max_actions_per_turn=1, max_actions_per_episode=10, validation_size=48
        )
    )
    trajectories = StarPO.play_validation_states_with(
        config, frozen_lake_hole_blind_policy(enable_thinking=False, is_slippery=False), build_tiny_tokenizer(0)
    )
    assert [t.seed for t in trajectories] == list(config.validation_starts())
    outcomes = [bool(t.success) for t in trajectories]
    # Each map's outcome equals the walk planned from the environment's own map; some maps end in a hole.
    assert outcomes == [hole_blind_walk(seed, budget=10) for seed in config.validation_starts()]
    assert 0 < sum(outcomes) < len(outcomes)
    assert all(t.format_errors == 0 for t in trajectories)


def test_baselines_are_filed_by_name_and_two_names_may_not_share_a_file(tmp_path):
    assert baseline_file("hole-blind policy") == "baselines/hole_blind_policy.parquet"
    with pytest.raises(ValueError, match="no letter or digit"):
        baseline_file("--")
    policy = frozen_lake_hole_blind_policy()
    job = JobSettings(output_dir=str(tmp_path / "runs"), iterations=1)
    with pytest.raises(ValueError, match="would share a file"):  # refused before any work: no run folder
        run_job(StarPOConfig().environment(SOLID_ICE), job, baselines={"hole blind": policy, "hole-blind": policy})
    with pytest.raises(ValueError, match="both a baseline and a known score"):  # one would hide the other's line
        run_job(
            StarPOConfig().environment(SOLID_ICE),
            job,
            known_scores={"random moves": 0.3},
            baselines={"random moves": policy},
        )
    assert not (tmp_path / "runs").exists()


def test_a_baseline_that_cannot_play_the_states_stops_the_run_before_any_rl(tmp_path, ray_session, small_config):
    def not_a_lake_policy(prompt):
        raise KeyError("this policy reads lakes, not Sokoban boards")

    job = JobSettings(output_dir=str(tmp_path), iterations=2, threads=1)
    with pytest.raises(KeyError, match="reads lakes"):
        run_job(small_config(), job, baselines={"lake policy": not_a_lake_policy})
    run = (tmp_path / "latest").resolve()
    assert run.is_dir() and not list(run.glob("*/result.json"))  # no trial started
