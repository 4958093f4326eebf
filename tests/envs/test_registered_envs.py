"""Checks every registered text environment must pass: gymnasium's checker, determinism, pickling."""

import json
import pickle
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rllib_ragen
from rllib_ragen.envs import TextEnv, make_text_env

ENV_IDS = rllib_ragen.registered_text_envs()


def test_builtins_are_registered():
    for name in [
        "Bandit",
        "BanditHeldOut",
        "BanditReversed",
        "Sokoban",
        "Sokoban8x8TwoBoxes",
        "SokobanAltSymbols",
        "SokobanCoordinates",
        "FrozenLake",
        "FrozenLakeNotSlippery",
        "Countdown",
        "Sudoku4x4",
    ]:
        assert f"rllib_ragen/{name}-v0" in ENV_IDS


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_env_checker_passes_without_warnings(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(env_id).unwrapped)


def _moves(env):
    """Moves to try: the action names, for an open action set (Countdown's expressions) a few of its moves, for a
    tool environment a call of each tool with each required argument a few names."""
    tools = [tool["function"] for tool in env.unwrapped.tools]
    if tools:
        return [
            json.dumps({"name": tool["name"], "arguments": {p: value for p in tool["parameters"]["required"]}})
            for value in ("Ada", "Ben", "Oslo")
            for tool in tools
        ]
    return list(env.unwrapped.action_names) or ["1 + 2", "3 * 4 - 5", "(6 - 2) * 5"]


def _random_rollout(env, seed, steps=30):
    rng = np.random.default_rng(seed)
    names = _moves(env) + ["not-an-action"]
    obs, _ = env.reset(seed=seed)
    trace = [obs]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(names[rng.integers(len(names))])
        trace.append((obs, reward, terminated, info["success"], info["action_is_valid"], info["action_is_effective"]))
        if terminated or truncated:
            break
    return trace


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_gives_same_rollout(env_id):
    for seed in range(5):
        assert _random_rollout(gym.make(env_id), seed) == _random_rollout(gym.make(env_id), seed)
    # ...and different seeds give different initial states somewhere among a few seeds.
    assert len({gym.make(env_id).reset(seed=s)[0] for s in range(10)}) > 1


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_pickle_round_trip_continues_identically(env_id):
    # Ray ships environments to workers by pickling them, mid-episode state included.
    env = gym.make(env_id)
    env.reset(seed=7)
    env.step(_moves(env)[0])
    clone = pickle.loads(pickle.dumps(env))
    for name in _moves(env)[:8] * 3:
        assert env.step(name) == clone.step(name)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_info_and_unknown_action(env_id):
    env = gym.make(env_id)
    obs, _ = env.reset(seed=3)
    obs2, reward, terminated, truncated, info = env.step("definitely not an action")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"success": False, "action_is_valid": False, "action_is_effective": False}
    if env.unwrapped.tools:  # a tool environment answers with an error; its state is as it was
        assert obs2.startswith("Error:") and env.unwrapped.observation == obs
        return
    assert obs2 == obs
    # Lookup ignores case and surrounding whitespace.
    first = _moves(env)[0]
    _, _, _, _, info = env.step(f"  {first.upper()} ")
    assert info["action_is_valid"] is True


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_describe_lists_every_action_or_the_move_syntax(env_id):
    env = gym.make(env_id).unwrapped
    names, text = env.action_names, env.describe()
    if env.tools:  # the tools reach the policy through the chat template, each with a description
        assert all(tool["function"]["description"] for tool in env.tools) and text
    elif 0 < len(names) <= 8:
        assert all(name in text for name in names)
    elif "Valid actions: " in text:  # a list of them all (tic-tac-toe's 9 cells)
        assert text.split("Valid actions: ")[1].split(".")[0].split(", ") == list(names)
    else:  # Sudoku's 64 moves, Countdown's expressions: the instructions give the syntax, with an example
        assert re.search(r"\d \d \d|\(6 - 2\) \* 5", text), text


def test_make_text_env_rejects_non_text_envs():
    with pytest.raises(TypeError, match="TextEnv"):
        make_text_env("CartPole-v1")
    assert isinstance(make_text_env("rllib_ragen/Sokoban-v0", dim=7).unwrapped, TextEnv)


def test_register_text_env_validates_entry_point():
    with pytest.raises(TypeError, match="subclass"):
        rllib_ragen.register_text_env("tests/NotText-v0", gym.Env)
    with pytest.raises(ValueError, match="already registered"):
        rllib_ragen.register_text_env("rllib_ragen/Sokoban-v0", "rllib_ragen.envs.bandit:BanditEnv")
