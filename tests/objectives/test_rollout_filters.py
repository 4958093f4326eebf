"""RAGEN's rollout filter strategies and RAGEN-2's SNR-adaptive filter, on hand-derived groups.

Scores are the within-group sample std (RAGEN's ``reward_variance`` metric). Most cases give the scores directly to
``ragen_selection``; the last ones go through ``select_groups`` from returns."""

import math

import pytest
import torch

from rllib_ragen.objectives import FilterSettings, fixed_kept_groups, ragen_selection, select_groups

# Five groups' scores; sum 10; largest first: 4 (g0), 3 (g3), 2 (g4), 1 (g2), 0 (g1).
SCORES = torch.tensor([4.0, 0.0, 1.0, 3.0, 2.0])


def kept(scores, **settings) -> set[int]:
    return set(ragen_selection(torch.as_tensor(scores, dtype=torch.float64), FilterSettings(**settings)).tolist())


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.5, {0, 3}),  # threshold 0.5 x 10 - 0.01 = 4.99: 4 < 4.99, 4 + 3 = 7 reaches it
        (0.9, {0, 3, 4}),  # 8.99: 4, 7, 9
        (0.4, {0}),  # 3.99: 4 alone reaches it
        (1.0, {0, 1, 2, 3, 4}),  # p >= 1 keeps every candidate
    ],
)
def test_top_p_linear_takes_the_best_groups_until_their_scores_reach_p_of_the_total(value, expected):
    assert kept(SCORES, mode="top_p", value=value) == expected
    # Without the zero-variance group: the same total, the same choice (but p = 1 keeps four).
    assert kept(SCORES, mode="top_p", value=value, include_zero=False) == expected - {1}


def test_top_p_linear_keeps_none_when_the_threshold_cannot_be_reached():
    # All groups without variance: the threshold is -0.01 and no positive score can be added.
    assert kept([0.0, 0.0, 0.0], mode="top_p", value=0.9) == set()
    # "smallest" meets the zero score first, where the reference stops: nothing.
    assert kept(SCORES, mode="top_p", value=0.5, filter_type="smallest") == set()
    # Without it: ascending 1, 2, 3 reach 4.99 (groups 2, 4, 3).
    assert kept(SCORES, mode="top_p", value=0.5, filter_type="smallest", include_zero=False) == {2, 4, 3}


def test_selection_eps_lowers_the_linear_threshold():
    # Two groups scoring 1, p = 0.999: the threshold is 1.998 - eps. With RAGEN's eps 0.01 (1.988) one group is
    # not enough; with eps 1 (0.998) it is.
    assert kept([1.0, 1.0], mode="top_p", value=0.999) == {0, 1}
    assert kept([1.0, 1.0], mode="top_p", value=0.999, selection_eps=1.0) == {0}


def test_top_p_softmax_is_a_nucleus_over_softmax_of_the_scores():
    # softmax([2, 0, 1]) = [0.665, 0.090, 0.245]: cumulative in order 0.665, 0.910, 1.0.
    assert kept([2.0, 0.0, 1.0], mode="top_p", value=0.8, top_p_mode="softmax") == {0, 2}
    assert kept([2.0, 0.0, 1.0], mode="top_p", value=0.6, top_p_mode="softmax") == {0}
    # "smallest" is softmax of the negated scores: [0.090, 0.665, 0.245] -> group 1 first.
    assert kept([2.0, 0.0, 1.0], mode="top_p", value=0.6, top_p_mode="softmax", filter_type="smallest") == {1}


def test_top_k_takes_a_share_of_all_groups_and_top_k_abs_a_count():
    assert kept(SCORES, mode="top_k", value=0.4) == {0, 3}  # int(0.4 x 5) = 2
    assert kept(SCORES, mode="top_k", value=0.1) == {0}  # int(0.5) = 0, at least 1
    assert kept(SCORES, mode="top_k", value=0.4, filter_type="smallest") == {1, 2}
    # The share counts every group, the zero-variance ones too, but only non-zero ones are candidates.
    assert kept([4.0, 0.0, 0.0, 0.0, 0.0], mode="top_k", value=0.4, include_zero=False) == {0}
    assert kept(SCORES, mode="top_k_abs", value=3) == {0, 3, 4}
    assert kept(SCORES, mode="top_k_abs", value=9) == {0, 1, 2, 3, 4}  # no more than there are
    assert kept([1.0, 1.0, 1.0], mode="top_k_abs", value=2) == {0, 1}  # ties: lower position first


def test_min_p_keeps_scores_close_to_the_best():
    assert kept(SCORES, mode="min_p", value=0.5) == {0, 3, 4}  # >= 0.5 x 4 = 2
    assert kept(SCORES, mode="min_p", value=1.0) == {0}
    # "smallest": <= min / value; without the zero group the minimum is 1, so <= 2.5. (At value 0.5 the
    # reference's min / (value + 1e-10) falls just under 2, and the group scoring 2 is out: {2}.)
    assert kept(SCORES, mode="min_p", value=0.4, filter_type="smallest", include_zero=False) == {2, 4}
    assert kept(SCORES, mode="min_p", value=0.5, filter_type="smallest", include_zero=False) == {2}


def test_snr_adaptive_is_linear_top_p_over_the_groups_with_variance():
    # p = 0.9 by default, zero-variance groups dropped first.
    assert kept(SCORES, mode="snr_adaptive") == {0, 3, 4}
    assert kept([0.0, 0.0, 1.0], mode="snr_adaptive") == {2}  # top_p alone would weigh all three
    assert kept([0.0, 0.0, 0.0], mode="snr_adaptive") == set()
    assert kept(SCORES, mode="snr_adaptive", value=0.5) == {0, 3}


def test_select_groups_scores_by_the_sample_std_and_reports_what_it_kept():
    # Groups of two: sample stds 0, sqrt 2, 0, 2 sqrt 2 (population stds 0, 1, 0, 2).
    returns = torch.tensor([0.0, 0.0, 0.0, 2.0, 1.0, 1.0, 0.0, 4.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    # Total 3 sqrt 2 = 4.243: p = 0.9 asks for 3.808, which 2.828 alone does not reach.
    keep, metrics = select_groups(returns, groups, settings=FilterSettings(mode="snr_adaptive"))
    assert set(groups[keep].tolist()) == {1, 3}
    assert metrics["rollout_filter/kept_groups"] == 2 and metrics["rollout_filter/kept_share"] == 0.5
    assert metrics["rollout_filter/zero_variance_groups"] == 2
    assert metrics["rollout_filter/kept_reward_std"] == pytest.approx(1.5)  # population stds of the kept: 1, 2
    # p = 0.5 asks for 2.111: the 2.828 group alone.
    keep, _ = select_groups(returns, groups, settings=FilterSettings(mode="snr_adaptive", value=0.5))
    assert set(groups[keep].tolist()) == {3}
    # Nothing kept: an empty mask, and no kept-group means.
    keep, metrics = select_groups(
        torch.ones(4), torch.tensor([0, 0, 1, 1]), settings=FilterSettings(mode="top_p", value=0.9)
    )
    assert not keep.any() and metrics["rollout_filter/kept_groups"] == 0
    assert math.isnan(metrics["rollout_filter/kept_reward_std"])


def test_strategies_rank_within_each_stratum():
    # Environment 0: g0 (0, 4), g1 (0, 2); environment 1: g2 (0, 1), g3 (1, 1). top_k_abs 1 per environment.
    returns = torch.tensor([0.0, 4.0, 0.0, 2.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    envs = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    settings = FilterSettings(mode="top_k_abs", value=1)
    keep, _ = select_groups(returns, groups, strata=envs, settings=settings)
    assert set(groups[keep].tolist()) == {0, 2}
    keep, _ = select_groups(returns, groups, settings=settings)
    assert set(groups[keep].tolist()) == {0}


def test_which_filters_keep_a_fixed_number_of_groups():
    assert fixed_kept_groups(8, FilterSettings(mode="std", ratio=0.25)) == 2
    assert fixed_kept_groups(8, FilterSettings(mode="top_k", value=0.25)) == 2
    assert fixed_kept_groups(8, FilterSettings(mode="top_k_abs", value=3)) == 3
    assert fixed_kept_groups(8, FilterSettings(mode="top_k_abs", value=3, include_zero=False)) is None
    for mode in ("top_p", "min_p", "snr_adaptive"):
        assert fixed_kept_groups(8, FilterSettings(mode=mode, value=0.9)) is None


def test_linear_top_p_below_one_keeps_the_same_groups_with_or_without_zero_variance_candidates():
    # A zero score is never added (the loop stops at it) and adds nothing to the total: so snr_adaptive is top_p
    # 0.9 whatever include_zero says, as the filter study found run for run.
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        scores = torch.rand(8, generator=generator) * (torch.rand(8, generator=generator) > 0.4)
        for value in (0.3, 0.6, 0.9):
            assert kept(scores, mode="top_p", value=value) == kept(
                scores, mode="top_p", value=value, include_zero=False
            )
        assert kept(scores, mode="snr_adaptive") == kept(scores, mode="top_p", value=0.9)
