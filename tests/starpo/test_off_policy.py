"""One-step off-policy rollouts (max_policy_lag=1): the next rollout plays on the remote env runner beside the
update, its lag is 1 and never more, the learner weights it by a truncated importance weight, and a resumed run
trains on exactly what the uninterrupted one did."""

import threading

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen.starpo.rollout_scheduler import ROLLOUT_THREAD

pytestmark = pytest.mark.usefixtures("ray_session")


def off_policy_config(small_config, **training):
    # No validation at all (validate_before_training would play one before the first update): the test counts rollouts.
    knobs = dict(validation_interval=0, validate_before_training=False, max_policy_lag=1, **training)
    return small_config(**knobs).env_runners(num_env_runners=1)


def _record_calls(obj, *methods, calls=None) -> list[tuple[str, str]]:
    """Wrap ``obj``'s ``methods`` to log (method, thread name) at each call, in call order, into ``calls`` (a new
    list by default); returns the log."""
    calls = [] if calls is None else calls

    def recording(name, method):
        def call(*args, **kwargs):
            calls.append((name, threading.current_thread().name))
            return method(*args, **kwargs)

        return call

    for name in methods:
        setattr(obj, name, recording(name, getattr(obj, name)))
    return calls


def test_off_policy_settings_are_checked_by_name(small_config):
    for config, words in (
        (small_config(max_policy_lag=2).env_runners(num_env_runners=1), "max_policy_lag=2"),
        (small_config(max_policy_lag=1), "num_env_runners >= 1"),
        (
            small_config(max_policy_lag=1, recompute_logprobs=False).env_runners(num_env_runners=1),
            "recompute_logprobs=True",
        ),
        (small_config(importance_weight_cap=0.5), "importance_weight_cap=0.5"),
    ):
        with pytest.raises(ValueError, match="Invalid StarPOConfig") as error:
            config.validate()
        assert words in str(error.value)


@pytest.mark.slow
def test_one_step_off_policy_lag_is_bounded_and_resume_is_exact(
    tmp_path, small_config, resumed_after_one_iteration, learner_state
):
    straight = off_policy_config(small_config).build_algo()
    calls = _record_calls(straight.rollouts, "play", "start_next")  # the rollout scheduler's fan-out and hand-off
    _record_calls(straight, "_update", calls=calls)
    try:
        results = [straight.train() for _ in range(3)]
        expected = learner_state(straight)
        behaviour_1 = [t.behaviour_logprobs for t in straight.last_rollout]
    finally:
        straight.stop()
    assert [r["rollout/policy_lag"] for r in results] == [0.0, 1.0, 1.0]
    learner = [r["learners"][DEFAULT_MODULE_ID] for r in results]
    assert learner[0]["off_policy/importance_weight_mean"] == pytest.approx(1.0, abs=1e-5)  # played by pi_old
    assert learner[0]["rollout/logprob_gap_max"] < 1e-5
    assert learner[1]["rollout/logprob_gap_max"] > 1e-3  # played one update ago: the weights now correct for it
    assert learner[1]["off_policy/importance_weight_mean"] != pytest.approx(1.0, abs=1e-4)
    assert all(r["learners"][DEFAULT_MODULE_ID]["actor/first_step_logprob_deviation"] == 0.0 for r in results)
    # Played beside the update: each iteration hands the next rollout to the rollout thread before it updates, and
    # every training rollout after the first plays there (an order of calls, not a timing: the machine may be busy).
    assert [name for name, thread in calls if thread == "MainThread" and name != "play"] == [
        "start_next",
        "_update",
    ] * 3
    rollout_threads = [thread for name, thread in calls if name == "play"]
    assert rollout_threads[0] == "MainThread" and len(rollout_threads) == 4
    assert all(thread.startswith(ROLLOUT_THREAD) for thread in rollout_threads[1:])

    # The checkpoint after one iteration holds the rollout in flight.
    resumed = resumed_after_one_iteration(off_policy_config(small_config).build_algo, tmp_path)
    try:
        resumed_results = [resumed.train() for _ in range(2)]
        state = learner_state(resumed)
        assert [t.behaviour_logprobs for t in resumed.last_rollout] == behaviour_1
    finally:
        resumed.stop()
    assert [r["rollout/policy_lag"] for r in resumed_results] == [1.0, 1.0]
    for key in ("actor/pg_loss", "off_policy/importance_weight_mean", "actor/grad_norm"):
        assert resumed_results[-1]["learners"][DEFAULT_MODULE_ID][key] == learner[2][key], key
    assert state.keys() == expected.keys()
    for key in state:  # policy and critic, bit for bit
        assert torch.equal(state[key], expected[key]), key
