"""Paired before/after comparison: hand-computed interval and exact McNemar p-values."""

import math

import pytest

from rllib_ragen.jobs.paired_stats import Z_95, exact_mcnemar_p, paired_comparison, pooled_comparison


def test_exact_mcnemar_by_hand():
    # 5 flips all one way: P(X <= 0) = 1/32 per tail, two-sided 2/32.
    assert exact_mcnemar_p(5, 0) == pytest.approx(2 / 32)
    # 3 up, 1 down: P(X <= 1) = (1 + 4) / 16, doubled = 0.625.
    assert exact_mcnemar_p(3, 1) == pytest.approx(0.625)
    assert exact_mcnemar_p(2, 2) == 1.0 and exact_mcnemar_p(0, 0) == 1.0  # never above 1; no flips, no evidence


def test_paired_comparison_by_hand():
    # Four states: one up, one down, two unchanged -> differences (1, -1, 0, 0); plus two more up.
    before = {1: 0.0, 2: 1.0, 3: 1.0, 4: 0.0, 5: 0.0, 6: 0.0}
    after = {1: 1.0, 2: 0.0, 3: 1.0, 4: 0.0, 5: 1.0, 6: 1.0}
    result = paired_comparison(before, after)
    diffs = [1, -1, 0, 0, 1, 1]
    mean = sum(diffs) / 6
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 5)
    assert (result.n, result.before, result.after, result.difference) == (
        6,
        pytest.approx(2 / 6),
        pytest.approx(4 / 6),
        pytest.approx(mean),
    )
    assert result.ci_high - result.difference == pytest.approx(1.959964 * sd / math.sqrt(6), rel=1e-6)
    assert (result.improved, result.worsened) == (3, 1)
    assert result.p_value == pytest.approx(0.625)
    assert "+0.333" in result.describe()


def test_pooling_keeps_each_runs_states_apart_though_they_share_seeds():
    # Two seeds' runs validated on the same four reset seeds: eight pairs, not four. Run a: one state up; run b: one
    # up. Differences (1, 0, 0, 0, 0, 0, 0, 1): mean 1/4, sum of squares about it 2 * 0.75^2 + 6 * 0.25^2 = 1.5.
    run_a = ({1: 0.0, 2: 0.0, 3: 1.0, 4: 1.0}, {1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0})
    run_b = ({1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0}, {1: 1.0, 2: 1.0, 3: 0.0, 4: 1.0})
    result = pooled_comparison({"seed0": run_a, "seed1": run_b})
    half = Z_95 * math.sqrt(1.5 / 7) / math.sqrt(8)
    assert (result.n, result.before, result.after, result.improved, result.worsened) == (8, 0.5, 0.75, 2, 0)
    assert (result.difference, result.ci_low, result.ci_high) == pytest.approx((0.25, 0.25 - half, 0.25 + half))
    assert result.p_value == pytest.approx(2 * 0.5**2)  # two flips, both up
    # One run alone is that run's own comparison.
    assert pooled_comparison({"seed0": run_a}).as_dict() == paired_comparison(*run_a).as_dict()


def test_states_must_match():
    with pytest.raises(ValueError, match="same states"):
        paired_comparison({1: 0.0, 2: 1.0}, {1: 0.0, 3: 1.0})
    with pytest.raises(ValueError, match="at least 2"):
        paired_comparison({1: 0.0}, {1: 1.0})


def test_several_episodes_of_one_state_are_averaged_into_one_paired_state():
    from rllib_ragen.jobs.readers import outcomes_by_state, state_of

    # validation_group_size=2: two episodes per state. The state is the unit: its episodes share its difficulty,
    # and the k-th before pairs with the k-th after no better than with any other. Two environments share seed 123
    # in a mixture and stay apart.
    before = outcomes_by_state(
        [
            ("a/S-v0", 123, 0.0),
            ("a/S-v0", 123, 1.0),
            ("a/S-v0", 124, 0.0),
            ("a/S-v0", 124, 0.0),
            ("F", 123, 0.0),
            ("F", 123, 0.0),
        ]
    )
    after = outcomes_by_state(
        [
            ("a/S-v0", 123, 1.0),
            ("a/S-v0", 123, 1.0),
            ("a/S-v0", 124, 0.0),
            ("a/S-v0", 124, 0.0),
            ("F", 123, 1.0),
            ("F", 123, 0.0),
        ]
    )
    assert before == {"a/S-v0:123": 0.5, "a/S-v0:124": 0.0, "F:123": 0.0}
    assert after == {"a/S-v0:123": 1.0, "a/S-v0:124": 0.0, "F:123": 0.5}
    assert state_of("a/S-v0:123") == ("a/S-v0", 123)
    result = paired_comparison(before, after)
    # By hand: differences +0.5, 0, +0.5 over n = 3 states (not 6 episodes); mean 1/3, sample sd sqrt(1/12),
    # half-width 1.96 sqrt(1/12) / sqrt(3) = 1.96 / 6; two states up, none down: p = 2 x (1/2)^2 = 0.5.
    assert (result.n, result.improved, result.worsened) == (3, 2, 0)
    assert result.difference == pytest.approx(1 / 3) and result.p_value == pytest.approx(0.5)
    assert (result.ci_low, result.ci_high) == (pytest.approx(1 / 3 - Z_95 / 6), pytest.approx(1 / 3 + Z_95 / 6))


def test_paired_by_subset_compares_within_each_subset():
    from rllib_ragen.jobs.paired_stats import paired_by_subset

    before = {"1/0": 0.0, "2/0": 0.0, "3/0": 1.0, "4/0": 0.0, "5/0": 1.0}
    after = {"1/0": 1.0, "2/0": 1.0, "3/0": 1.0, "4/0": 0.0, "5/0": 0.0}
    label = {"1/0": 2, "2/0": 2, "3/0": 2, "4/0": 5, "5/0": 7}
    result = paired_by_subset(before, after, label)
    assert list(result) == [2, 5, 7]
    # Length 2: states 1, 2 up, 3 unchanged -> before 1/3, after 1, two flips one way: p = 2 / 4.
    assert (result[2]["n"], result[2]["improved"], result[2]["worsened"]) == (3, 2, 0)
    assert (result[2]["before"], result[2]["after"]) == (pytest.approx(1 / 3), 1.0)
    assert result[2]["p_value"] == pytest.approx(0.5)
    assert result[5] == {"n": 1, "before": 0.0, "after": 0.0}  # one state: no interval, its outcome only
    assert result[7] == {"n": 1, "before": 1.0, "after": 0.0}


def test_the_mcnemar_p_value_is_the_two_sided_binomial_sum_by_hand():
    """scipy's binomtest against the sum written out: P(Binomial(n, 1/2) as far from n/2 as seen), both tails."""
    import math

    for improved, worsened in [(7, 2), (0, 9), (12, 12), (30, 11), (1, 0)]:
        flips = improved + worsened
        tail = sum(math.comb(flips, k) for k in range(min(improved, worsened) + 1)) / 2**flips
        assert exact_mcnemar_p(improved, worsened) == pytest.approx(min(1.0, 2 * tail), rel=1e-12)
