"""Numerical faults: a far-off log-ratio never turns the loss NaN; a non-finite loss never reaches the weights."""

import pytest
import torch

from rllib_ragen.objectives import policy_loss


def test_a_huge_log_ratio_gives_a_finite_loss_and_gradient():
    # log-ratios of +-100: exp overflows float32 past ~88, so unclamped the loss would be inf/NaN.
    logp = torch.tensor([[100.0, -100.0, 0.5]], requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0, 1.0]])
    loss, metrics = policy_loss(logp, torch.zeros(1, 3), advantages, torch.ones(1, 3), dual_clip=None)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    # Hand-derived: token 1 (A=+1, rho=e^20) is clipped at 1.28 -> -1.28; token 2 (A=-1, rho=e^-20) at 0.8 -> 0.8;
    # token 3 (A=+1, rho=e^0.5=1.6487) -> -1.28. Token mean: (-1.28 + 0.8 - 1.28) / 3.
    assert abs(loss.item() - (-1.28 + 0.8 - 1.28) / 3) < 1e-6


def _tensors(state) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for value in state.values() for t in _tensors(value)]
    if isinstance(state, (list, tuple)):
        return [t for value in state for t in _tensors(value)]
    return []


@pytest.mark.slow
def test_a_non_finite_loss_skips_the_step_leaving_weights_and_optimizer_state(ray_session, small_config):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from rllib_ragen.starpo.update_batch import prepare_update_batch

    algo = small_config(validation_interval=0, max_consecutive_skipped_steps=2).build_algo()
    try:
        algo.train()  # one ordinary step, so Adam has moments to protect
        learner = algo.learner_group._learner
        weights = {k: v.detach().clone() for k, v in learner.module[DEFAULT_MODULE_ID].state_dict().items()}
        moments = [t.clone() for t in _tensors(learner._get_optimizer_state())]
        for t in algo.last_rollout:  # rewards of 1e36: the critic's squared error overflows float32
            t.turn_rewards = [1e36] * len(t.turn_rewards)
        columns, _ = prepare_update_batch(algo.last_rollout, algo.config, algo._pad_token_id())
        batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=1)

        result = algo.learner_group.update(batch=batch)[0][DEFAULT_MODULE_ID]
        assert result["perf/skipped_optimizer_steps"].peek() == 1
        after = learner.module[DEFAULT_MODULE_ID].state_dict()
        assert all(torch.equal(after[k], weights[k]) for k in weights)
        assert all(torch.equal(a, b) for a, b in zip(_tensors(learner._get_optimizer_state()), moments))
        with pytest.raises(FloatingPointError, match="2 optimizer steps in a row.*learning rate.*rewards"):
            algo.learner_group.update(batch=batch)
    finally:
        algo.stop()
