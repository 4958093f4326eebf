"""``max_context_tokens`` bounds the whole trajectory: each reply gets only the room left, a first prompt that leaves
no room is not played (counted), and a setting no first prompt fits fails at build."""

import logging

import pytest
import torch

from rllib_ragen.envs import TextEnv
from rllib_ragen.rollout import RolloutConfig, RolloutEngine, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.backends import HFBackend
from rllib_ragen.rollout.models import load_policy


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_policy("tiny", seed=0)


class _Recording:
    """A real backend, with the longest prompt it was ever asked to continue."""

    def __init__(self, backend):
        self.backend, self.longest_prompt = backend, 0

    def generate(self, prompts, params, seed=None, max_new_tokens=None):
        self.longest_prompt = max([self.longest_prompt] + [len(p) for p in prompts])
        return self.backend.generate(prompts, params, seed, max_new_tokens)

    def load_weights(self, state_dict):
        self.backend.load_weights(state_dict)


@pytest.mark.parametrize("limit", [300, 420])
def test_an_untrained_model_never_writes_past_the_limit(tiny, limit):
    model, tokenizer = tiny
    # An untrained model babbles until max_new_tokens: without a per-reply cap its last reply overshoots the limit.
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/Sokoban-v0", max_context_tokens=limit), HFBackend(model, tokenizer), tokenizer
    )
    trajectories, metrics = engine.rollout(
        [0, 1], 2, SamplingParams(max_new_tokens=200, stop_strings=()), sample_seed=0
    )
    lengths = [len(t.token_ids) for t in trajectories]
    assert len(trajectories) == 4 and max(lengths) <= limit, lengths
    assert metrics["rollout/truncated_rate"] == 1.0
    # The budget is used, not wasted: each trajectory ends within one closing text of the limit.
    assert min(lengths) > limit - 200 - engine.reply_reserve


def test_backends_honour_per_prompt_caps(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer.encode("Turn 1. State:"), tokenizer.encode("Turn 2. State: more text here")]
    params = SamplingParams(max_new_tokens=12, stop_strings=())
    for backend in (HFBackend(model, tokenizer), ScriptedBackend(lambda prompt: "word " * 50, tokenizer)):
        replies = backend.generate(prompts, params, seed=0, max_new_tokens=[3, 40])
        assert [len(r.token_ids) for r in replies] == [3, 12], type(backend).__name__  # 40 is above the 12 limit
        with pytest.raises(ValueError, match="one cap >= 1 per prompt"):
            backend.generate(prompts, params, seed=0, max_new_tokens=[0, 5])


class _Wordy(TextEnv):
    """Seed 0 shows a 100,000-character board; every other seed a short one."""

    action_names = ("Go",)
    instructions = "Say Go."

    def reset(self, *, seed=None, options=None):
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def _reset_state(self):
        pass

    def _apply(self, action_index):
        self._success = True
        return 1.0, True, True

    def _render_text(self):
        return "ab " * 33_334 if self._seed == 0 else "ab"


def test_a_first_prompt_with_no_room_is_not_played_but_counted(tiny, caplog):
    _, tokenizer = tiny
    backend = _Recording(ScriptedBackend(lambda prompt: "<think></think><answer>Go</answer>", tokenizer))
    engine = RolloutEngine(RolloutConfig(env=_Wordy, max_context_tokens=4096), backend, tokenizer)
    with caplog.at_level(logging.WARNING, logger="rllib_ragen.rollout.engine"):
        trajectories, metrics = engine.rollout([0, 1], 2, SamplingParams())
    assert sorted(t.seed for t in trajectories) == [1, 1] and all(t.success for t in trajectories)
    assert metrics["rollout/prompts_too_long"] == 2.0
    assert backend.longest_prompt < 4096  # the huge prompt never reached the model
    assert any("leave no room for a reply under max_context_tokens=4096" in r.getMessage() for r in caplog.records)


def test_a_rollout_where_no_first_prompt_fits_names_the_setting(tiny):
    _, tokenizer = tiny
    engine = RolloutEngine(
        RolloutConfig(env=_Wordy, max_context_tokens=4096),
        ScriptedBackend(lambda prompt: "<think></think><answer>Go</answer>", tokenizer),
        tokenizer,
    )
    with pytest.raises(ValueError, match="no episode can be played. Raise max_context_tokens"):
        engine.rollout([0], 2, SamplingParams())


def test_building_with_a_limit_no_first_prompt_fits_fails_naming_the_field(ray_session, small_config):
    config = small_config().training(max_context_tokens=64)
    with pytest.raises(ValueError, match=r"max_context_tokens=64 leaves no room for a reply: the first prompts"):
        config.build_algo()
