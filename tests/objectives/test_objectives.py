"""StarPO math against hand-computed values."""

import math

import pytest
import torch

from rllib_ragen.objectives import (
    aggregate,
    compute_batch_advantages,
    compute_gae,
    compute_group_advantages,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    place_rewards,
    policy_loss,
    select_groups,
    truncated_importance_weights,
    value_loss,
)


def _loss_per_token(ratios, advantage, **kwargs):
    ratios = torch.tensor([ratios])
    out = []
    for i in range(ratios.shape[1]):
        mask = torch.zeros_like(ratios)
        mask[0, i] = 1
        loss, _ = policy_loss(
            torch.log(ratios), torch.zeros_like(ratios), torch.full_like(ratios, advantage), mask, **kwargs
        )
        out.append(round(loss.item(), 6))
    return out


def test_clip_higher_is_asymmetric():
    # A = +1: L = max(-r, -clip(r, 0.8, 1.28)). r=1.25 sits inside the higher bound: -1.25 (symmetric 0.2 gives -1.2).
    assert _loss_per_token([0.5, 0.9, 1.25, 1.5], 1.0, clip_low=0.2, clip_high=0.28) == [-0.5, -0.9, -1.25, -1.28]
    assert _loss_per_token([1.25], 1.0, clip_low=0.2, clip_high=0.2) == [-1.2]
    # A = -1: L = max(r, clip(r, 0.8, 1.28)): r=0.5 -> 0.8 (clipped below), r=1.5 -> 1.5 (unbounded above).
    assert _loss_per_token([0.5, 0.9, 1.5], -1.0, clip_low=0.2, clip_high=0.28, dual_clip=None) == [0.8, 0.9, 1.5]


def test_dual_clip_bounds_negative_advantages():
    # A = -1, c = 3: L = min(max(r, clip(r)), 3): r=5 -> 3, r=2 -> 2. A = +1 is untouched: r=5 -> -1.28.
    assert _loss_per_token([2.0, 5.0], -1.0, dual_clip=3.0) == [2.0, 3.0]
    assert _loss_per_token([5.0], 1.0, dual_clip=3.0) == [-1.28]


def test_clip_fractions_and_first_update_ratio():
    ratios = torch.tensor([[1.5, 0.5, 1.0, 1.1]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones_like(ratios)
    _, m = policy_loss(torch.log(ratios), torch.zeros_like(ratios), advantages, mask)
    # 1.5 with A > 0 clips high, 0.5 with A < 0 clips low; none reaches the dual clip's bound (ratio 3).
    assert m["actor/pg_clipfrac_high"] == 0.25 and m["actor/pg_clipfrac_low"] == 0.25
    assert m["actor/pg_clipfrac"] == 0.5 and m["actor/pg_clipfrac_dual"] == 0.0
    # k1 = mean(-log r), k3 = mean(r - 1 - log r) over [1.5, 0.5, 1.0, 1.1].
    logs = [math.log(r) for r in (1.5, 0.5, 1.0, 1.1)]
    assert m["actor/ppo_kl"] == pytest.approx(-sum(logs) / 4, abs=1e-6)
    assert m["actor/approx_kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in logs) / 4, abs=1e-6)
    # First update: logp == old_logp -> ratio 1, KL 0, loss = -token-mean(A), gradient -A / n per token.
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 0.5]])
    loss, m = policy_loss(logp, logp.detach().clone(), adv, torch.ones(1, 3))
    assert m["actor/ratio_mean"] == 1.0 and m["actor/approx_kl_k3"] == 0.0 and m["actor/ppo_kl"] == 0.0
    assert loss.item() == pytest.approx(-(2.0 - 1.0 + 0.5) / 3)
    loss.backward()
    assert torch.allclose(logp.grad, -adv / 3)


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)  # (1+2+3+4)/4
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(loss, mask, "sum")


def test_gae_with_gamma_lambda_one_is_return_minus_value():
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0]])
    rewards = torch.tensor([[0.0, -0.1, 0.0, 0.0, 0.0, 10.9, 0.0]])
    values = torch.tensor([[1.0, 2.0, 7.0, 7.0, 3.0, 4.0, 7.0]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    rewards_to_go = torch.tensor([[10.8, 10.8, 0, 0, 10.9, 10.9, 0]])
    assert torch.allclose(advantages, (rewards_to_go - values) * mask)
    assert torch.allclose(returns, rewards_to_go * mask)


def test_gae_skips_observation_tokens_by_hand():
    # mask [1, 0, 1], r = [0, 0, 1], V = [0.5, 9, 0.2], gamma 0.9, lambda 0.8:
    # t=2: delta = 1 - 0.2 = 0.8, A = 0.8.  t=1: observation, skipped.
    # t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32, A = -0.32 + 0.9 * 0.8 * 0.8 = 0.256; return = 0.756.
    advantages, returns = compute_gae(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.2]]), torch.tensor([[1, 0, 1]]), gamma=0.9, lam=0.8
    )
    assert torch.allclose(advantages, torch.tensor([[0.256, 0.0, 0.8]]))
    assert torch.allclose(returns, torch.tensor([[0.756, 0.0, 1.0]]))


def test_gae_ignores_what_the_mask_hides():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 0]] * 3)
    rewards = torch.randn(3, 9) * mask
    values = torch.randn(3, 9)
    a1, r1 = compute_gae(rewards, values, mask, gamma=0.95, lam=0.9)
    a2, r2 = compute_gae(rewards, torch.where(mask.bool(), values, torch.randn(3, 9) * 100), mask, 0.95, 0.9)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)


def test_group_advantages_and_zero_std_groups():
    returns = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 4.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    # Group 0 has std 0 -> zero advantages. Group 1: mean 2, std 2 -> [-1, 0, 1]; mean-only -> [-2, 0, 2].
    assert torch.allclose(compute_group_advantages(returns, groups), torch.tensor([0, 0, 0, -1, 0, 1.0]), atol=1e-5)
    assert torch.allclose(
        compute_group_advantages(returns, groups, normalize_std=False), torch.tensor([0, 0, 0, -2, 0, 2.0])
    )
    # Equal returns whose float32 mean rounds off (10.9 x 8): exactly zero, not a rounding error over a tiny std.
    for value in (10.9, 0.1, -3.7, 1e6 + 0.3):
        assert torch.equal(
            compute_group_advantages(torch.full((8,), value), torch.zeros(8, dtype=torch.long)), torch.zeros(8)
        )
    # BRPO: one group over the batch: mean 1.5.
    brpo = compute_batch_advantages(returns, normalize_std=False)
    assert torch.allclose(brpo, returns - 1.5)


def test_place_rewards_trajectory_or_turn_level():
    ends, rewards = [[2, 5], [1]], [[-0.1, 10.9], [0.5]]
    trajectory = place_rewards(ends, rewards, (2, 7))
    assert trajectory[0, 5].item() == pytest.approx(10.8) and trajectory[0].count_nonzero() == 1
    per_turn = place_rewards(ends, rewards, (2, 7), per_turn=True)
    assert per_turn[0, 2].item() == pytest.approx(-0.1) and per_turn[0, 5].item() == pytest.approx(10.9)
    assert per_turn[1, 1].item() == 0.5


def test_filter_keeps_the_most_uncertain_groups():
    # Group stds (population): g0 [0, 0] -> 0, g1 [0, 1] -> 0.5, g2 [0, 10] -> 5, g3 [1, 1] -> 0.
    returns = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 10.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    keep, m = select_groups(returns, groups, keep_ratio=0.25)
    assert keep.tolist() == [False, False, False, False, True, True, False, False]
    assert m["rollout_filter/kept_reward_std"] == 5.0 and m["rollout_filter/reward_std"] == pytest.approx(5.5 / 4)
    keep, _ = select_groups(returns, groups, keep_ratio=0.5)
    assert set(groups[keep].tolist()) == {1, 2}
    keep, _ = select_groups(returns, groups, keep_ratio=0.5, mode="reversed_std")
    assert set(groups[keep].tolist()) == {0, 3}  # equal std 0: ties go to lower ids
    assert select_groups(returns, groups, keep_ratio=0.25, mode="none")[0].all()
    # Out-of-range ratios (and dual_clip <= 1) are refused by StarPOConfig.validate, the one place settings are
    # checked: tests/starpo/test_config.py.


def test_filter_ranks_within_each_stratum_when_given_one():
    # Stds (population): environment 0 holds g0 [0, 10] -> 5, g1 [0, 4] -> 2, g2 [1, 1] -> 0, g3 [0, 2] -> 1;
    # environment 1 holds g4 [0, 1] -> 0.5 and g5 [3, 3] -> 0.
    returns = torch.tensor([0.0, 10.0, 0.0, 4.0, 1.0, 1.0, 0.0, 2.0, 0.0, 1.0, 3.0, 3.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
    envs = torch.tensor([0] * 8 + [1] * 4)
    # Over the whole batch, ceil(0.25 x 6) = 2 groups: both from environment 0, none from environment 1.
    keep, m = select_groups(returns, groups, keep_ratio=0.25)
    assert sorted(set(groups[keep].tolist())) == [0, 1] and m["rollout_filter/kept_groups"] == 2
    # Per environment: ceil(0.25 x 4) = 1 of environment 0 (g0) and ceil(0.25 x 2) = 1 of environment 1 (g4).
    keep, m = select_groups(returns, groups, keep_ratio=0.25, strata=envs)
    assert sorted(set(groups[keep].tolist())) == [0, 4] and m["rollout_filter/kept_groups"] == 2
    assert m["rollout_filter/kept_reward_std"] == pytest.approx((5 + 0.5) / 2)
    keep, _ = select_groups(returns, groups, keep_ratio=0.5, mode="reversed_std", strata=envs)
    assert sorted(set(groups[keep].tolist())) == [2, 3, 5]  # the least uncertain: 2 of 4, 1 of 2
    with pytest.raises(ValueError, match=r"groups \[5\] span two strata"):
        select_groups(returns, groups, strata=torch.tensor([0] * 8 + [1] * 3 + [0]))


def test_entropy_kl_value_loss_explained_variance():
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8))
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    for estimator in ("k1", "k2", "k3"):
        assert torch.all(kl_penalty(logp, logp, estimator) == 0)
    # k3 = r - 1 - log r with log r = ref - logp = [-0.5, 1.0]: [e^-0.5 - 0.5, e - 2].
    assert torch.allclose(kl_penalty(logp, ref, "k3"), torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2]]))
    # V = 1, V_old = 0, R = 2, clip 0.5: clipped V = 0.5 -> 0.5 * max(1, 2.25) = 1.125, clipped.
    loss, m = value_loss(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(1.125) and m["critic/vf_clipfrac"] == 1.0
    # |V - V_old| = 0.3 < 0.5: the clip does not act, whatever old + (V - old) rounds to.
    loss, m = value_loss(torch.tensor([[-0.2]]), torch.tensor([[0.1]]), torch.tensor([[-0.2]]), torch.ones(1, 1))
    assert m["critic/vf_clipfrac"] == 0.0 and loss.item() == 0.0
    r = torch.tensor([[1.0, 2.0, 3.0]])
    assert explained_variance(r, r, torch.ones(1, 3)) == 1.0
    assert explained_variance(torch.full_like(r, 2.0), r, torch.ones(1, 3)) == pytest.approx(0.0)


def test_truncated_importance_weights_by_hand():
    # pi_prox / pi_behav = e^0.5, e^1 (cut to the cap 2), e^-0.5, and a masked position.
    proximal = torch.tensor([[-1.0, -0.5, -2.0, -3.0]])
    behaviour = torch.tensor([[-1.5, -1.5, -1.5, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights, truncated = truncated_importance_weights(proximal, behaviour, mask, cap=2.0)
    assert torch.allclose(weights, torch.tensor([[math.exp(0.5), 2.0, math.exp(-0.5), 0.0]]))
    assert truncated.tolist() == [[False, True, False, False]]
    # Weighting the advantage weights the clipped surrogate, dual clip included: w > 0 passes through min and max.
    logp = torch.tensor([[-0.8, -0.1, -2.6, -3.0]])
    advantages = torch.tensor([[1.0, -2.0, -1.0, 5.0]])
    weighted, _ = policy_loss(
        logp,
        proximal,
        advantages * weights,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=3.0,
        aggregation="seq-mean-token-sum",
    )
    per_token = [
        policy_loss(
            logp[:, i : i + 1],
            proximal[:, i : i + 1],
            advantages[:, i : i + 1],
            mask[:, i : i + 1],
            clip_low=0.2,
            clip_high=0.28,
            dual_clip=3.0,
            aggregation="seq-mean-token-sum",
        )[0]
        for i in range(3)
    ]
    assert torch.allclose(weighted, sum(w * loss for w, loss in zip(weights[0, :3], per_token)))


def test_scored_logprobs_are_those_of_the_full_logits_at_the_scored_tokens_by_hand():
    """A 3-token vocabulary, the identity as LM head, so the hidden state at t - 1 is the logits of token t."""
    from rllib_ragen.objectives import scored_logprobs_and_entropy, scored_token_logprobs

    hidden = torch.tensor([[[0.0, 0.0, 0.0], [math.log(2), 0.0, 0.0], [0.0, 0.0, 0.0]]])  # (1, 3, 3)
    ids = torch.tensor([[2, 0, 1]])
    scored = torch.tensor([[0, 1, 1]])
    head = torch.nn.Identity()
    logp, entropy = scored_logprobs_and_entropy(hidden, head, ids, scored, temperature=1.0)
    assert torch.equal(scored_token_logprobs(hidden, head, ids, scored, temperature=1.0), logp)
    # Token 1 (id 0) from uniform logits: log 1/3; token 2 (id 1) from (log 2, 0, 0): log 1/4.
    assert logp[0].tolist() == pytest.approx([0.0, math.log(1 / 3), math.log(1 / 4)])
    # (1/2, 1/4, 1/4): -(1/2 log 1/2 + 2 * 1/4 log 1/4)
    assert entropy[0].tolist() == pytest.approx([0.0, math.log(3), -(0.5 * math.log(0.5) + 0.5 * math.log(0.25))])
    # At temperature 2 the second distribution is softmax(log 2 / 2, 0, 0) = (sqrt 2, 1, 1) / (2 + sqrt 2).
    logp, _ = scored_logprobs_and_entropy(hidden, head, ids, torch.tensor([[0, 0, 1]]), temperature=2.0)
    assert logp[0].tolist() == pytest.approx([0.0, 0.0, math.log(1 / (2 + math.sqrt(2)))])


def test_scored_logprobs_agree_with_the_full_pass_on_a_real_model():
    from rllib_ragen.objectives import scored_logprobs_and_entropy, token_logprobs_and_entropy
    from rllib_ragen.rollout.models import load_policy

    model, _ = load_policy("tiny")
    ids = torch.randint(5, 500, (3, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    scored = (torch.rand(3, 40, generator=torch.Generator().manual_seed(1)) < 0.3).long()
    scored[:, 0] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        full_logp, full_entropy = token_logprobs_and_entropy(out.logits, ids, 0.7)
        logp, entropy = scored_logprobs_and_entropy(
            out.hidden_states[-1], model.get_output_embeddings(), ids, scored, 0.7
        )
    assert torch.allclose(logp, full_logp * scored, atol=1e-6) and torch.allclose(
        entropy, full_entropy * scored, atol=1e-5
    )
    assert (logp[scored == 0] == 0).all()


def test_scored_logprobs_pass_the_full_passes_gradient_to_the_trunk():
    """The loss's gradient reaches the hidden states and the head as the full (B, T, V) computation's does."""
    from rllib_ragen.objectives import scored_logprobs_and_entropy, token_logprobs_and_entropy

    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 6, 8, generator=generator)
    head = torch.nn.Linear(8, 11, bias=False)
    ids = torch.randint(0, 11, (2, 6), generator=generator)
    scored = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1]])
    grads = []
    for full in (True, False):
        h = hidden.clone().requires_grad_()
        head.zero_grad()
        if full:
            logp, entropy = token_logprobs_and_entropy(head(h), ids, 0.7)
        else:
            logp, entropy = scored_logprobs_and_entropy(h, head, ids, scored, 0.7)
        ((logp - 0.01 * entropy) * scored).sum().backward()
        grads.append((h.grad.clone(), head.weight.grad.clone()))
    for full_grad, scored_grad in zip(*grads):
        torch.testing.assert_close(scored_grad, full_grad, rtol=0, atol=1e-6)


def test_scored_logprobs_in_head_chunks_give_the_same_values_and_gradients(monkeypatch):
    """Past ``HEAD_CHUNK_NUMBERS`` the head runs chunk by chunk, each re-run in the backward pass: the same values and
    gradients to float rounding (a product over fewer rows may round differently); without gradients, one pass."""
    from rllib_ragen.objectives import losses, scored_logprobs_and_entropy, scored_token_logprobs

    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 8, generator=generator)
    head = torch.nn.Linear(8, 11, bias=False)
    ids = torch.randint(0, 11, (2, 9), generator=generator)
    scored = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 1], [0, 0, 1, 1, 1, 1, 0, 1, 1]])  # 12 scored rows
    results = []
    for chunk_rows in (None, 5):  # the whole 12 rows at once, then chunks of 5, 5 and 2
        if chunk_rows:
            monkeypatch.setattr(losses, "HEAD_CHUNK_NUMBERS", chunk_rows * 11)
        h = hidden.clone().requires_grad_()
        head.zero_grad()
        logp, entropy = scored_logprobs_and_entropy(h, head, ids, scored, 0.7)
        ((logp - 0.01 * entropy) * scored).sum().backward()
        assert torch.equal(scored_token_logprobs(h, head, ids, scored, 0.7), logp)
        results.append((logp.detach(), entropy.detach(), h.grad.clone(), head.weight.grad.clone()))
    (logp, entropy, *grads), (chunked_logp, chunked_entropy, *chunked_grads) = results
    for value, chunked in ((logp, chunked_logp), (entropy, chunked_entropy), *zip(grads, chunked_grads)):
        torch.testing.assert_close(chunked, value, rtol=0, atol=1e-6)
    calls = []
    monkeypatch.setattr("torch.utils.checkpoint.checkpoint", lambda *a, **k: calls.append(a))
    with torch.no_grad():
        scored_token_logprobs(hidden, head, ids, scored, 0.7)
    assert calls == []
