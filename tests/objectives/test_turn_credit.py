"""Turn-aware credit: bi-level GAE, turn-level GAE and GiGPO against hand-derived values and their limits; the
reference's advantage whitening."""

import threading

import pytest
import torch

from rllib_ragen.objectives import (
    AdvantageInputs,
    AdvantageSettings,
    advantage_recursion_mask,
    compute_advantages,
    compute_bi_level_gae,
    compute_gae,
    compute_gigpo_step_advantages,
    compute_turn_gae,
    masked_whiten,
    place_rewards,
    turn_end_mask,
    turn_index,
)

# Row 0: turn 1 on tokens 0-2 (reward 1), an observation on 3-4 (values there must never be read), turn 2 on 5-6
# (reward 2). Row 1: a turn whose reward is exactly 0 (tokens 0-1), then a one-token turn (reward 1), padding.
MASK = torch.tensor([[1, 1, 1, 0, 0, 1, 1], [1, 1, 0, 1, 0, 0, 0]], dtype=torch.float32)
REWARDS = torch.tensor([[0, 0, 1.0, 0, 0, 0, 2.0], [0, 0, 0, 1.0, 0, 0, 0]])
VALUES = torch.tensor([[0.5, 0.4, 0.3, 9.0, 9.0, 0.2, 0.1], [0.2, 0.1, 5.0, 0.3, 7.0, 7.0, 7.0]])


def test_turn_ends_and_indices_come_from_the_mask():
    assert turn_end_mask(MASK).nonzero().tolist() == [[0, 2], [0, 6], [1, 1], [1, 3]]
    assert turn_index(MASK).tolist() == [[0, 0, 0, -1, -1, 1, 1], [0, 0, -1, 1, -1, -1, -1]]


def test_advantage_mask_through_observations_spans_first_to_last_sampled_token():
    assert advantage_recursion_mask(MASK, "sampled").tolist() == MASK.tolist()
    assert advantage_recursion_mask(MASK, "sampled_and_observations").tolist() == [[1] * 7, [1, 1, 1, 1, 0, 0, 0]]
    late_start = torch.tensor([[0, 0, 1, 0, 1, 0]])  # the first prompt and the padding after the end are no steps
    assert advantage_recursion_mask(late_start, "sampled_and_observations").tolist() == [[0, 0, 1, 1, 1, 0]]
    with pytest.raises(ValueError, match="choose one of"):
        advantage_recursion_mask(MASK, "everything")


def test_gae_through_observations_by_hand():
    # gamma 1, lambda 0.5. Stepping through the observation (values 9.0 at tokens 3-4), row 0:
    # A6 = 2 - 0.1 = 1.9, A5 = (0.1 - 0.2) + 0.5 * 1.9 = 0.85, A4 = (0.2 - 9) + 0.5 * 0.85 = -8.375,
    # A3 = (9 - 9) + 0.5 * -8.375 = -4.1875, A2 = (1 + 9 - 0.3) + 0.5 * -4.1875 = 7.60625,
    # A1 = (0.3 - 0.4) + 0.5 * 7.60625 = 3.703125, A0 = (0.4 - 0.5) + 0.5 * 3.703125 = 1.7515625.
    # Row 1: A3 = 0.7, A2 = (0.3 - 5) + 0.35 = -4.35, A1 = (5 - 0.1) - 2.175 = 2.725, A0 = (0.1 - 0.2) + 1.3625.
    through = advantage_recursion_mask(MASK, "sampled_and_observations")
    advantages, _ = compute_gae(REWARDS, VALUES, through, gamma=1.0, lam=0.5)
    torch.testing.assert_close(
        advantages,
        torch.tensor(
            [[1.7515625, 3.703125, 7.60625, -4.1875, -8.375, 0.85, 1.9], [1.2625, 2.725, -4.35, 0.7, 0, 0, 0]]
        ),
    )
    # Skipping the observation (the default) the same rewards give A2 = (1 + 0.2 - 0.3) + 0.5 * 0.85 = 1.325, ...
    skipped, _ = compute_gae(REWARDS, VALUES, MASK, gamma=1.0, lam=0.5)
    torch.testing.assert_close(skipped[0], torch.tensor([0.18125, 0.5625, 1.325, 0, 0, 0.85, 1.9]))


def test_bi_level_gae_by_hand():
    # gamma_turn 0.5, gamma_token 0.9, lambda 0.8. Row 0, turn level: A2 = 2 - 0.1 = 1.9 (G2 = 2.0);
    # A1 = (1 + 0.5 * 0.1 - 0.3) + 0.5 * 0.8 * 1.9 = 1.51 (G1 = 1.81).
    # Token level, each turn ending on its own G: turn 2: A6 = 1.9, A5 = (0.9 * 0.1 - 0.2) + 0.72 * 1.9 = 1.258;
    # turn 1: A2 = 1.51, A1 = (0.9 * 0.3 - 0.4) + 0.72 * 1.51 = 0.9572, A0 = (0.9 * 0.4 - 0.5) + 0.72 * 0.9572.
    # Row 1: A3 = 1 - 0.3 = 0.7 (G = 1); the zero-reward turn: A1 = (0 + 0.5 * 0.3 - 0.1) + 0.4 * 0.7 = 0.33,
    # A0 = (0.9 * 0.1 - 0.2) + 0.72 * 0.33 = 0.1276.
    advantages, returns = compute_bi_level_gae(REWARDS, VALUES, MASK, gamma_turn=0.5, gamma_token=0.9, lam=0.8)
    a0 = -0.14 + 0.72 * 0.9572
    expected = torch.tensor([[a0, 0.9572, 1.51, 0, 0, 1.258, 1.9], [0.1276, 0.33, 0, 0.7, 0, 0, 0]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert torch.allclose(returns, (expected + VALUES) * MASK, atol=1e-6)


def _random_turns(seed: int, batch: int = 6, width: int = 40):
    """Random multi-turn rows: replies and observations of random lengths, one reward per turn."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, width)
    ends, rewards = [], []
    for row in range(batch):
        position, row_ends = int(torch.randint(0, 4, (1,), generator=generator)), []
        while True:
            length = int(torch.randint(1, 6, (1,), generator=generator))
            if position + length > width:
                break
            mask[row, position : position + length] = 1
            row_ends.append(position + length - 1)
            position += length + int(torch.randint(1, 5, (1,), generator=generator))
        ends.append(row_ends)
        rewards.append(torch.randn(len(row_ends), generator=generator).tolist())
    token_rewards = place_rewards(ends, rewards, (batch, width), per_turn=True)
    return mask, token_rewards, torch.randn(batch, width, generator=generator)


@pytest.mark.parametrize("seed", range(5))
def test_bi_level_gae_with_every_discount_one_is_trajectory_gae_on_turn_rewards(seed):
    mask, rewards, values = _random_turns(seed)
    bi_level, bi_returns = compute_bi_level_gae(rewards, values, mask, gamma_turn=1.0, gamma_token=1.0, lam=1.0)
    flat, flat_returns = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(bi_level, flat, atol=1e-5) and torch.allclose(bi_returns, flat_returns, atol=1e-5)


def test_turn_gae_by_hand_and_one_value_per_turn():
    # gamma 0.5, lambda 1: row 0 A2 = 1.9, A1 = 0.75 + 0.5 * 1.9 = 1.7; row 1 A2 = 0.7, A1 = 0.05 + 0.5 * 0.7.
    advantages, returns = compute_turn_gae(REWARDS, VALUES, MASK, gamma=0.5, lam=1.0)
    assert torch.allclose(advantages, torch.tensor([[1.7, 1.7, 1.7, 0, 0, 1.9, 1.9], [0.4, 0.4, 0, 0.7, 0, 0, 0]]))
    assert torch.allclose(returns, torch.tensor([[2.0, 2.0, 2.0, 0, 0, 2.0, 2.0], [0.5, 0.5, 0, 1.0, 0, 0, 0]]))
    mask, rewards, values = _random_turns(7)
    advantages, _ = compute_turn_gae(rewards, values, mask)
    index = turn_index(mask)
    for row in range(mask.shape[0]):
        for turn in range(int(index[row].max()) + 1):
            assert advantages[row][index[row] == turn].unique().numel() == 1


def test_gigpo_step_advantages_compare_turns_that_saw_the_same_state():
    # One group. A: states [s0, s1], rewards [0, 1]; B: [s0, s2], rewards [0.2, 0]. Step gamma 0.5: step returns
    # A [0.5, 1], B [0.2, 0]. Only s0 repeats: mean 0.35 -> A0 +0.15, B0 -0.15; s1, s2 alone -> 0.
    steps = compute_gigpo_step_advantages(
        [[0.0, 1.0], [0.2, 0.0]], [["s0", "s1"], ["s0", "s2"]], torch.tensor([0, 0]), gamma=0.5, normalize_std=False
    )
    assert torch.allclose(torch.tensor(steps), torch.tensor([[0.15, 0.0], [-0.15, 0.0]]))
    # The same state in another group is another anchor.
    steps = compute_gigpo_step_advantages([[1.0], [0.0]], [["s0"], ["s0"]], torch.tensor([0, 1]), normalize_std=False)
    assert steps == [[0.0], [0.0]]


def _gigpo_inputs(states):
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 1, 1, 0]], dtype=torch.float32)
    turn_rewards = [[0.0, 1.0], [0.2, 0.0]]
    rewards = place_rewards([[1, 3], [0, 3]], turn_rewards, (2, 5), per_turn=True)
    return AdvantageInputs(
        token_rewards=rewards,
        response_mask=mask,
        returns=torch.tensor([1.0, 0.2]),
        group_ids=torch.tensor([0, 0]),
        turn_rewards=turn_rewards,
        turn_states=states,
    )


def test_gigpo_adds_omega_times_the_step_advantage_to_grpo():
    settings = AdvantageSettings(normalize_std=False, step_gamma=0.5, omega=0.5)
    advantages, _ = compute_advantages("gigpo", _gigpo_inputs([["s0", "s1"], ["s0", "s2"]]), settings)
    # Episode (mean-only GRPO): A +0.4, B -0.4; plus 0.5 x the step advantages above, per turn.
    assert torch.allclose(advantages, torch.tensor([[0.475, 0.475, 0, 0.4, 0], [-0.475, 0, -0.4, -0.4, 0]]))


def test_gigpo_without_repeated_states_is_grpo():
    settings = AdvantageSettings(step_gamma=0.5, omega=1.0)
    inputs = _gigpo_inputs([["a", "b"], ["c", "d"]])
    gigpo, _ = compute_advantages("gigpo", inputs, settings)
    grpo, _ = compute_advantages("grpo", inputs, settings)
    assert torch.equal(gigpo, grpo)


def test_gigpo_refuses_turns_the_mask_does_not_hold():
    inputs = _gigpo_inputs([["a", "b"], ["c", "d"]])
    broken = AdvantageInputs(
        **{**vars(inputs), "turn_rewards": [[0.0, 1.0, 2.0], [0.2, 0.0]], "turn_states": [["a", "b", "c"], ["c", "d"]]}
    )
    with pytest.raises(ValueError, match="every turn must be one contiguous run"):
        compute_advantages("gigpo", broken, AdvantageSettings())


def test_masked_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 99.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # Over [1, 2, 3]: mean 2, Bessel variance 1 -> [-1, 0, 1]; masked positions become 0.
    assert torch.allclose(masked_whiten(x, mask), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), atol=1e-6)


def test_equal_advantages_whiten_to_exactly_zero_on_one_learner_and_on_two():
    # Every token -0.2 (each episode the same format penalty, the critic still zero). In float32 the mean of 16
    # copies of -0.2 is not -0.2; that rounding error times rsqrt(0 + 1e-8) = 1e4 was an advantage near 1e-4.
    x = torch.full((2, 9), -0.2)
    mask = torch.ones(2, 9)
    mask[1, 7:] = 0  # 9 + 7 tokens
    assert (x * mask).sum() / mask.sum() != x[0, 0]  # the float32 mean is off...
    assert torch.equal(masked_whiten(x, mask), torch.zeros(2, 9))  # ...the whitened advantages are exactly 0
    # Two learners, one row each, summing their statistics as DDP's all-reduce does (here: two threads).
    barrier, posted = threading.Barrier(2), [None, None]

    def all_reduce(rank: int, t: torch.Tensor) -> torch.Tensor:
        posted[rank] = t
        barrier.wait()
        total = posted[0] + posted[1]
        barrier.wait()  # both have read before either posts its next statistic
        return total

    def two_learners() -> torch.Tensor:
        shards = [None, None]

        def learner(rank: int) -> None:
            rows = slice(rank, rank + 1)
            shards[rank] = masked_whiten(x[rows], mask[rows], sum_over_shards=lambda t: all_reduce(rank, t))

        threads = [threading.Thread(target=learner, args=(rank,)) for rank in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        return torch.cat(shards)

    assert torch.equal(two_learners(), torch.zeros(2, 9))
    x[1, :7] = torch.arange(7.0)  # unequal values whiten over both shards as over the whole batch
    torch.testing.assert_close(two_learners(), masked_whiten(x, mask))


@pytest.mark.parametrize("estimator", ["gae", "bi_level_gae", "turn_gae"])
def test_estimators_with_a_critic_whiten_by_default_and_keep_their_returns(estimator):
    mask, rewards, values = _random_turns(3)
    inputs = AdvantageInputs(
        token_rewards=rewards,
        response_mask=mask,
        returns=rewards.sum(-1),
        group_ids=torch.zeros(mask.shape[0], dtype=torch.long),
        values=values,
    )
    raw, raw_returns = compute_advantages(estimator, inputs, AdvantageSettings(whiten=False))
    whitened, returns = compute_advantages(estimator, inputs, AdvantageSettings())
    assert torch.allclose(whitened, masked_whiten(raw, mask)) and torch.equal(returns, raw_returns)
    on = whitened[mask > 0]
    assert abs(on.mean().item()) < 1e-5 and on.std().item() == pytest.approx(1.0, abs=1e-4)
