"""Every turn-aware estimator trains StarPO end to end, with per-turn rewards and with both critics."""

import math

import pytest
from ray.rllib.core import DEFAULT_MODULE_ID


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(
    "estimator, critic",
    [("bi_level_gae", "separate"), ("bi_level_gae", "head"), ("turn_gae", "separate"), ("gigpo", "separate")],
)
def test_a_turn_aware_estimator_trains_one_iteration(small_config, estimator, critic):
    config = small_config(
        validation_interval=0,
        advantage_estimator=estimator,
        turn_level_rewards=True,
        max_turns=3,
        rollout_filter_ratio=1.0,
    ).rl_module(model_config={"critic": critic})
    algo = config.build_algo()
    try:
        learner = algo.train()["learners"][DEFAULT_MODULE_ID]
    finally:
        algo.stop()
    assert math.isfinite(learner["actor/pg_loss"]) and learner["actor/grad_norm"] > 0
    # Estimators with a critic train it; GiGPO builds none.
    assert ("critic/vf_loss" in learner) == (estimator != "gigpo")
    assert learner["perf/skipped_optimizer_steps"] == 0


@pytest.mark.parametrize(
    "knobs, message",
    [
        (dict(advantage_estimator="gigpo", group_size=1, rollout_filter_ratio=1.0), "group_size >= 2"),
        (dict(gamma_turn=0.0), "gamma_turn=0.0 must lie in (0, 1]"),
        (dict(gigpo_omega=-1.0), "gigpo_omega=-1.0 must be >= 0"),
        (dict(whiten_advantages="yes"), "whiten_advantages='yes' must be True or False"),
        (dict(advantage_mask="observations"), "advantage_mask='observations': choose one of"),
        (
            dict(advantage_estimator="bi_level_gae", advantage_mask="sampled_and_observations"),
            "applies to advantage_estimator='gae' only",
        ),
    ],
)
def test_bad_estimator_settings_fail_at_validate(small_config, knobs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        small_config(**knobs).validate()
