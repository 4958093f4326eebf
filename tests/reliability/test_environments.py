"""Environments that misbehave: a non-finite reward or unencodable text is handled and counted; a non-string
observation is the environment's bug and is named."""

import logging

import pytest

from rllib_ragen.envs import TextEnv
from rllib_ragen.rollout import RolloutConfig, RolloutEngine, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.models import build_tiny_tokenizer


class _OddEnv(TextEnv):
    """One action, 'Go', which ends the episode. What it pays and shows depends on the reset seed: seed 0 is
    sane, 1 pays NaN, 2 pays inf, 3 shows a lone surrogate, 4 shows a number."""

    action_names = ("Go",)
    instructions = "Say Go."

    def _reset_state(self):
        self.kind = int(self.np_random.integers(1)) + self._seed

    def reset(self, *, seed=None, options=None):
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def _apply(self, action_index):
        self._success = True
        return {1: float("nan"), 2: float("inf")}.get(self.kind, 1.0), True, True

    def _render_text(self):
        return {3: "bad \ud800 text", 4: 42}.get(self.kind, "fine")


@pytest.fixture(scope="module")
def engine():
    tokenizer = build_tiny_tokenizer(seed=0)
    backend = ScriptedBackend(lambda prompt: "<think></think><answer>Go</answer>", tokenizer)
    return RolloutEngine(RolloutConfig(env=_OddEnv, max_turns=1), backend, tokenizer)


def test_non_finite_rewards_drop_their_trajectories_with_one_warning(engine, caplog):
    with caplog.at_level(logging.WARNING, logger="rllib_ragen.rollout.engine"):
        trajectories, metrics = engine.rollout([0, 1, 2], 2, SamplingParams())
        engine.rollout([1], 1, SamplingParams())
    assert sorted(t.seed for t in trajectories) == [0, 0]  # only the sane seed's two episodes reach the update
    assert metrics["rollout/nonfinite_rewards"] == 4.0 and metrics["rollout/env_errors"] == 0.0
    assert sum("non-finite reward" in r.getMessage() for r in caplog.records) == 1  # once per environment


def test_unencodable_observation_text_is_replaced_and_counted(engine):
    trajectories, metrics = engine.rollout([3], 2, SamplingParams())
    # Two episodes, each shown the text at reset and again after its step: four texts replaced.
    assert len(trajectories) == 2 and metrics["rollout/unencodable_texts"] == 4.0
    assert "bad ? text" in trajectories[0].text


def test_a_non_string_observation_is_named_with_class_and_method(engine):
    with pytest.raises(TypeError, match=r"_OddEnv.reset\(\) returned a int observation"):
        engine.rollout([4], 1, SamplingParams())
