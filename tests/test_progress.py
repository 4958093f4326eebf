"""The main jobs' time-left estimate: iterations only, the warm-up iteration and one-off costs left out."""

import pytest

from rllib_ragen.jobs.run import _Clock


def test_time_left_counts_typical_iterations_and_the_validations_still_due():
    clock = _Clock(iterations=10, validation_interval=2)
    # Iteration 1: 40 s, of which 10 s were the "before RL" validation (StarPO's time/validate_s).
    clock.record(40.0, validated=False, validation_seconds=10.0, validations=1)
    # Only iteration 1 seen: 9 iterations of its own 30 s, plus validations at 2, 4, 6, 8 and 10.
    assert clock.seconds_left(1) == pytest.approx(9 * 30 + 5 * 10)
    assert clock.last_s == 40.0  # the line's s/it is the whole iteration
    clock.record(20.0, validated=True, validation_seconds=12.0, validations=1)  # a validation now takes 12 s
    clock.record(8.0, validated=False, validation_seconds=0.0, validations=0)
    # Iterations 4-10 at the median own 8 s (iteration 1's warm-up left out), validations at 4, 6, 8 and 10.
    assert clock.seconds_left(3) == pytest.approx(7 * 8 + 4 * 12)


def test_an_iteration_with_the_before_validation_and_a_scheduled_one_splits_their_time():
    clock = _Clock(iterations=4, validation_interval=1)
    clock.record(50.0, validated=True, validation_seconds=30.0, validations=2)  # before RL, and after iteration 1
    assert clock.validation_s == 15.0 and clock.seconds_left(1) == pytest.approx(3 * 20 + 3 * 15)


def test_a_resumed_run_infers_the_validation_cost_and_counts_the_closing_validation():
    clock = _Clock(iterations=25, validation_interval=10)
    for seconds, validated in [(20.0, False), (8.0, False), (9.0, False), (7.0, False), (15.0, True)]:
        clock.record(seconds, validated)
    # No timed validation: it costs what a validating iteration takes beyond a typical one (15 - 8). Left after
    # iteration 5: 20 iterations, validations at 10 and 20, and the closing one after 25.
    assert clock.seconds_left(5) == pytest.approx(20 * 8 + 3 * 7)
