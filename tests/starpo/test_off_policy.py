"""One-step off-policy rollouts (max_policy_lag=1): the next rollout plays on the remote env runner beside the
update, its lag is 1 and never more, the learner weights it by a truncated importance weight, and a resumed run
trains on exactly what the uninterrupted one did."""

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

pytestmark = pytest.mark.usefixtures("ray_session")


def off_policy_config(small_config, **training):
    knobs = dict(validation_interval=0, max_policy_lag=1, **training)
    return small_config(**knobs).env_runners(num_env_runners=1)


def test_off_policy_settings_are_checked_by_name(small_config):
    for config, words in ((small_config(max_policy_lag=2).env_runners(num_env_runners=1), "max_policy_lag=2"),
                          (small_config(max_policy_lag=1), "num_env_runners >= 1"),
                          (small_config(max_policy_lag=1, recompute_logprobs=False).env_runners(num_env_runners=1),
                           "recompute_logprobs=True"),
                          (small_config(importance_weight_cap=0.5), "importance_weight_cap=0.5")):
        with pytest.raises(ValueError, match="Invalid StarPOConfig") as error:
            config.validate()
        assert words in str(error.value)


@pytest.mark.slow
def test_one_step_off_policy_lag_is_bounded_and_resume_is_exact(tmp_path, small_config, resumed_after_one_iteration,
                                                                learner_state):
    straight = off_policy_config(small_config).build_algo()
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
    assert results[1]["time/sample_s"] < results[0]["time/sample_s"]  # it was already played during the update

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
