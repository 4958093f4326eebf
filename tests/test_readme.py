"""The README's examples must run as written: a newcomer copies them first."""

import contextlib
import io
import pathlib
import re

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_block_after(marker: str) -> str:
    text = README.read_text()
    start = text.index(marker)
    return re.search(r"```python\n(.*?)```", text[start:], re.DOTALL).group(1)


def test_custom_environment_example_runs_and_is_short():
    code = _python_block_after("<!-- custom-env")
    assert len(code.strip().splitlines()) < 40
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README custom-env", "exec"), {})
    assert out.getvalue().strip() == "Counter: 0 1.0 True"
    check_env(gym.make("my_project/Countdown-v0").unwrapped)


def test_environment_and_protocol_examples_run():
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    env_block = next(b for b in blocks if "solve_level(env.unwrapped.level)" in b)
    protocol_block = next(b for b in blocks if "execute_turn(env, reply" in b)
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(env_block, "README environments", "exec"), namespace)
        exec(compile(protocol_block, "README protocol", "exec"), namespace)
    # "Left || Up" is well-formed and both are Sokoban actions: no penalty, Left runs first.
    assert namespace["turn"].format_error is False and namespace["turn"].executed[0] == "Left"


def test_rollout_example_runs():
    text = README.read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "RolloutEngine(config" in b)
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block, "README rollout", "exec"), namespace)
    t = namespace["t"]
    assert len(namespace["trajectories"]) == 8 and sum(t.response_mask) > 0 and len(t.turn_rewards) == t.num_turns
