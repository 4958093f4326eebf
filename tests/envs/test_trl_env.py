"""A class written to TRL's ``environment_factory`` contract (``trl_games.py``) plays unchanged as
``rllib_ragen/TRL-v0``: its tasks reach ``reset``, its public methods are the tools, ``get_reward`` is the return."""

import json
import pathlib
import sys

import pytest

from rllib_ragen.envs import make_text_env
from rllib_ragen.rollout.backends import SamplingParams, ScriptedBackend
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.tiny_model import build_tiny_tokenizer

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from trl_games import TASKS, CounterEnv  # noqa: E402

TRL = "rllib_ragen/TRL-v0"
CONFIG = {"environment": "trl_games:CounterEnv", "tasks": TASKS}


def _call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _counting_policy(prompt: str) -> str:
    """Adds 9 (or what is left) until the target it read, then stops with a final reply."""
    import re

    target = int(re.findall(r"the target is (\d+)", prompt)[-1])
    counters = re.findall(r"The counter is at (\d+)", prompt)
    left = target - int(counters[-1])
    return _call("add", amount=min(left, 9)) if left > 0 else "The counter is at its target."


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_the_class_is_read_as_trl_reads_it():
    env = make_text_env(TRL, **CONFIG).unwrapped
    assert [tool["function"]["name"] for tool in env.tools] == ["add", "double"]
    assert env.tools[0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"amount": {"type": "integer", "description": "how much to add (1 to 9)."}},
        "required": ["amount"],
    }
    observation, _ = env.reset(seed=4)  # seed 4 plays task 4 % 3 = 1: the prompt's last message, then reset's text
    assert observation == "Bring the counter to its target.\nThe counter is at 0; the target is 12."


def test_a_trl_environment_plays_to_its_reward_through_the_engine(tokenizer):
    engine = RolloutEngine(
        RolloutConfig(env=TRL, env_config=CONFIG, max_turns=4), ScriptedBackend(_counting_policy, tokenizer), tokenizer
    )
    trajectories, metrics = engine.rollout([0, 1, 2], group_size=1, sampling=SamplingParams())
    assert metrics[f"{TRL}/success"] == 1.0 and metrics["rollout/tool_call_errors"] == 0
    by_target = {t.seed: t for t in trajectories}
    # Target 3: one call, then the final reply. Target 12: 9 then 3. Each turn is paid get_reward()'s change.
    assert by_target[0].turn_rewards == [1.0, 0.0] and by_target[0].num_turns == 2
    assert by_target[1].turn_rewards == [0.0, 1.0, 0.0] and by_target[1].total_return == 1.0


def test_an_episode_cut_by_the_turn_limit_still_returns_get_reward_at_its_end(tokenizer):
    overshoot = lambda prompt: _call("add", amount=9)  # noqa: E731 -- 9 passes target 3 at once and never returns
    engine = RolloutEngine(
        RolloutConfig(env=TRL, env_config=CONFIG, max_turns=3), ScriptedBackend(overshoot, tokenizer), tokenizer
    )
    (t,), _ = engine.rollout([2], group_size=1, sampling=SamplingParams())  # target 7: 9, 18, 27
    assert t.num_turns == 3 and t.turn_rewards == [0.0, 0.0, 0.0] and not t.success
    engine = RolloutEngine(
        RolloutConfig(env=TRL, env_config=CONFIG, max_turns=2),
        ScriptedBackend(lambda prompt: _call("add", amount=3), tokenizer),
        tokenizer,
    )
    (t,), _ = engine.rollout([0], group_size=1, sampling=SamplingParams())  # target 3: reached, then passed
    assert t.turn_rewards == [1.0, -1.0] and t.total_return == 0.0  # = get_reward() when the turns ran out


def test_a_tool_that_raises_is_answered_with_its_error_and_counted(tokenizer):
    replies = iter([_call("add", amount=20), _call("add", amount="3"), _call("add", amount=3), "Done."])
    engine = RolloutEngine(
        RolloutConfig(env=TRL, env_config=CONFIG, max_turns=4),
        ScriptedBackend(lambda prompt: next(replies), tokenizer),
        tokenizer,
    )
    (t,), metrics = engine.rollout([0], group_size=1, sampling=SamplingParams())
    assert "Error: ValueError: amount must be between 1 and 9" in t.text  # the tool's own error, as TRL answers
    assert "Error: the arguments of 'add' do not fit its schema (amount: '3' is not of type 'integer')." in t.text
    assert t.success and t.turn_rewards == pytest.approx([0.0, -0.1, 1.0, 0.0])
    assert metrics["rollout/tool_call_errors"] == 2 and metrics["rollout/env_errors"] == 0


def test_what_the_contract_needs_is_checked_when_the_environment_is_built():
    class NoReward:
        def reset(self, **kwargs):
            return None

        def act(self, x: int) -> str:
            """Act.

            Args:
                x: a number.
            """
            return ""

    with pytest.raises(TypeError, match="must define get_reward"):
        make_text_env(TRL, environment=NoReward)
    with pytest.raises(TypeError, match="tasks must be a list of dicts"):
        make_text_env(TRL, environment=CounterEnv, tasks=[3])
    with pytest.raises(ValueError, match="must be an import path"):
        make_text_env(TRL, environment="trl_games.CounterEnv")


def test_an_async_tool_runs_to_its_end(tokenizer):
    replies = iter([_call("add", amount=6), _call("double"), "Done."])
    engine = RolloutEngine(
        RolloutConfig(env=TRL, env_config=CONFIG, max_turns=4),
        ScriptedBackend(lambda prompt: next(replies), tokenizer),
        tokenizer,
    )
    (t,), _ = engine.rollout([1], group_size=1, sampling=SamplingParams())  # target 12: 6, then doubled
    assert t.turn_rewards == [0.0, 1.0, 0.0] and "The counter is at 12." in t.text


class NumpyReward(CounterEnv):
    """get_reward as numpy computes it: a numpy.float32, a number like any other."""

    def get_reward(self):
        import numpy as np

        return np.float32(super().get_reward())


def test_a_numpy_reward_is_a_number(tokenizer):
    engine = RolloutEngine(
        RolloutConfig(env=TRL, env_config={"environment": NumpyReward, "tasks": TASKS}, max_turns=4),
        ScriptedBackend(_counting_policy, tokenizer),
        tokenizer,
    )
    (t,), metrics = engine.rollout([0], group_size=1, sampling=SamplingParams())  # target 3
    assert metrics["rollout/env_errors"] == 0 and t.success and sum(t.turn_rewards) == 1.0


class NoReset:
    def get_reward(self) -> float:
        return 0.0

    def act(self) -> str:
        """Act."""
        return ""


@pytest.mark.parametrize(
    "env_config, message",
    [
        ({"environment": NoReset}, "env_config for 'rllib_ragen/TRL-v0': TypeError: NoReset has no reset()"),
        ({"environment": "no_such_module:Env"}, "ModuleNotFoundError: No module named 'no_such_module'"),
        ({"environment": "trl_games:NoSuchClass"}, "AttributeError: module 'trl_games' has no attribute 'NoSuchClass'"),
        ({"environment": CounterEnv, "tasks": []}, "tasks is empty"),
    ],
)
def test_a_trl_environment_that_cannot_be_built_fails_validate(env_config, message):
    from rllib_ragen import StarPOConfig

    with pytest.raises(ValueError, match="Invalid StarPOConfig") as error:
        StarPOConfig().environment(TRL, env_config=env_config).validate()
    assert message in str(error.value)
