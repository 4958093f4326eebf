"""The supervised warm start's weight averaging and non-finite guard (rllib_ragen.sft)."""

import pytest
import torch

import rllib_ragen.sft as sft
from rllib_ragen.experiment import JobSettings
from rllib_ragen.rollout import RolloutConfig, load_policy
from rllib_ragen.rollout.scripted import random_arm_policy
from rllib_ragen.sft import collect_demonstrations, supervised_warm_start


@pytest.fixture(scope="module")
def bandit_demos():
    model, tokenizer = load_policy("tiny", seed=0)
    demos = collect_demonstrations(RolloutConfig(env="rllib_ragen/Bandit-v0", max_turns=1), random_arm_policy(seed=0),
                                   tokenizer, 32)
    return demos, tokenizer.pad_token_id


def weights_after(steps, demos, pad, **kwargs):
    model, _ = load_policy("tiny", seed=0)
    supervised_warm_start(model, demos, steps=steps, batch_size=8, lr=2e-3, pad_token_id=pad, log_every=0, **kwargs)
    return [p.detach().clone() for p in model.parameters()]


def test_average_decay_leaves_the_moving_average_of_the_weights(bandit_demos):
    demos, pad = bandit_demos
    w0 = [p.detach().clone() for p in load_policy("tiny", seed=0)[0].parameters()]
    w1, w2 = weights_after(1, demos, pad), weights_after(2, demos, pad)  # the training path does not depend on it
    averaged = weights_after(2, demos, pad, average_decay=0.25)
    # avg0 = w0; avg1 = 0.25 w0 + 0.75 w1; avg2 = 0.25 avg1 + 0.75 w2 = 0.0625 w0 + 0.1875 w1 + 0.75 w2
    for a, p0, p1, p2 in zip(averaged, w0, w1, w2):
        torch.testing.assert_close(a, 0.0625 * p0 + 0.1875 * p1 + 0.75 * p2, rtol=0, atol=1e-6)
    assert any(not torch.equal(a, p2) for a, p2 in zip(averaged, w2))


def test_a_non_finite_warm_start_loss_raises_before_the_weights_change(bandit_demos, monkeypatch):
    demos, pad = bandit_demos
    model, _ = load_policy("tiny", seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setattr(sft, "token_logprobs", lambda logits, ids: torch.full(ids.shape, float("nan")))
    with pytest.raises(FloatingPointError, match="lower lr"):
        supervised_warm_start(model, demos, steps=3, batch_size=8, pad_token_id=pad, average_decay=0.9)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("decay", [1.0, -0.1, 1.5])
def test_an_average_decay_outside_0_1_is_refused(bandit_demos, decay):
    demos, pad = bandit_demos
    with pytest.raises(ValueError, match="average_decay"):
        supervised_warm_start(load_policy("tiny", seed=0)[0], demos, steps=1, pad_token_id=pad, average_decay=decay)


@pytest.mark.parametrize("value", [1.0, -0.5, True, "0.9", float("nan")])
def test_job_settings_refuse_a_bad_warm_start_average_decay(value):
    with pytest.raises(ValueError, match="warm_start_average_decay"):
        JobSettings(warm_start_average_decay=value).validate()
