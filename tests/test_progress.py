"""The main jobs' time-left estimate: iterations only, the warm-up iteration and one-off costs left out."""

import pytest

from rllib_ragen.jobs.run import _Clock


def test_time_left_counts_typical_iterations_and_the_validations_still_due():
    clock = _Clock(iterations=10, validation_interval=2)
    clock.validation_s = 10.0  # the "before" validation, timed by the driver
    clock.record(30.0, validated=False)  # iteration 1: warm-up
    # Only the warm-up seen: 9 iterations of 30 s, plus validations at 2, 4, 6, 8 and 10.
    assert clock.seconds_left(1) == pytest.approx(9 * 30 + 5 * 10)
    clock.record(12.0, validated=True)
    clock.record(8.0, validated=False)
    # Iterations 4-10 at the median plain 8 s (the warm-up left out), validations at 4, 6, 8 and 10.
    assert clock.seconds_left(3) == pytest.approx(7 * 8 + 4 * 10)


def test_a_resumed_run_infers_the_validation_cost_and_counts_the_closing_validation():
    clock = _Clock(iterations=25, validation_interval=10)
    for seconds, validated in [(20.0, False), (8.0, False), (9.0, False), (7.0, False), (15.0, True)]:
        clock.record(seconds, validated)
    # No timed validation: it costs what a validating iteration takes beyond a typical one (15 - 8). Left after
    # iteration 5: 20 iterations, validations at 10 and 20, and the closing one after 25.
    assert clock.seconds_left(5) == pytest.approx(20 * 8 + 3 * 7)
