"""Bradley-Terry ratings against hand-derived values: a pair's gap is the log of its points ratio."""

import math

import pytest

from rllib_ragen.jobs.ratings import ELO_PER_UNIT, bradley_terry


def test_three_wins_in_four_rate_log_three_apart_with_the_information_s_interval():
    ratings = bradley_terry({("a", "b"): [1, 1, 1, 0]}, anchor="a", prior_draws=0)
    # sigmoid(gap) = 3/4 at the maximum: gap = ln 3 (190.8 Elo); the information is 4 * 3/4 * 1/4 = 0.75.
    assert ratings.elo[0] == 0.0 and ratings.elo[1] == pytest.approx(-math.log(3) * ELO_PER_UNIT, abs=1e-6)
    half = 1.959963984540054 / math.sqrt(0.75) * ELO_PER_UNIT
    assert ratings.ci_low[1] == pytest.approx(ratings.elo[1] - half, abs=1e-6)
    assert ratings.ci_high[1] == pytest.approx(ratings.elo[1] + half, abs=1e-6)
    assert ratings.points == [3.0, 1.0] and ratings.games == [4, 4]
    assert ratings.expected_score("a", "b") == pytest.approx(0.75, abs=1e-9)
    assert ratings.table().splitlines()[2].startswith("| a | +0 |")  # strongest first, the anchor without interval


def test_draws_count_half_each_way_and_the_prior_keeps_a_sweep_finite():
    even = bradley_terry({("a", "b"): [0.5, 0.5], ("b", "c"): [1, 0], ("a", "c"): [0, 1]}, anchor="a", prior_draws=0)
    assert even.elo == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)
    # One win and one virtual draw: 1.5 points of 2, so sigmoid(gap) = 3/4 again.
    swept = bradley_terry({("a", "b"): [1]}, anchor="b", prior_draws=1)
    assert swept.elo[0] == pytest.approx(math.log(3) * ELO_PER_UNIT, abs=1e-6)
    with pytest.raises(ValueError, match="won or lost every game"):
        bradley_terry({("a", "b"): [1]}, anchor="b", prior_draws=0)


def test_a_chain_of_pairs_adds_up_and_unlinked_players_are_refused():
    # a scores 3/4 against b, b 3/4 against c, and they never met: c sits 2 ln 3 below a.
    chain = bradley_terry({("a", "b"): [1, 1, 1, 0], ("b", "c"): [1, 1, 1, 0]}, anchor="a", prior_draws=0)
    assert chain.elo == pytest.approx([0.0, -math.log(3) * ELO_PER_UNIT, -2 * math.log(3) * ELO_PER_UNIT], abs=1e-6)
    with pytest.raises(ValueError, match="cannot be rated"):
        bradley_terry({("a", "b"): [1, 0], ("c", "d"): [1, 0]}, anchor="a")
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        bradley_terry({("a", "b"): [-1.0]}, anchor="a")
