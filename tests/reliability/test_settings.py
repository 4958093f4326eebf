"""Settings a hostile or careless user gives: each fails at validate() naming the field, and no value the user set
is changed behind their back (-1 included)."""

import math

import pytest

from rllib_ragen import StarPO, StarPOConfig
from rllib_ragen.rollout.models import load_policy


@pytest.mark.parametrize(
    "knobs, field",
    [
        (dict(lr=-1e-4), "lr=-0.0001"),
        (dict(critic_lr=0.0), "critic_lr=0.0"),
        (dict(grad_clip=-1.0), "grad_clip=-1.0"),
        (dict(lambda_=1.5), "lambda_=1.5"),
        (dict(gamma=0.0), "gamma=0.0"),
        (dict(temperature=math.nan), "temperature=nan"),
        (dict(value_clip=0.0), "value_clip=0.0"),
        (dict(format_penalty=math.inf), "format_penalty=inf"),
        (dict(ineffective_action_penalty=math.nan), "ineffective_action_penalty=nan"),
        (dict(ungrounded_reasoning_penalty=math.inf), "ungrounded_reasoning_penalty=inf"),
        (dict(entropy_coeff=math.nan), "entropy_coeff=nan"),
        (dict(kl_coeff="0.1"), "kl_coeff='0.1'"),
        (dict(max_context_tokens=0), "max_context_tokens=0"),
        (dict(enable_thinking="no"), "enable_thinking='no'"),
        (dict(micro_batch_size=1.5), "micro_batch_size=1.5"),
        (dict(num_groups=True), "num_groups=True"),
        (dict(rollout_filter_ratio=math.nan), "rollout_filter_ratio=nan"),
        (dict(dual_clip=math.nan), "dual_clip=nan"),
        (dict(train_seed_start=-5), "train_seed_start=-5"),
        (dict(validation_interval=2.5), "validation_interval=2.5"),
        (dict(env_step_timeout_s=math.inf), "env_step_timeout_s=inf"),
        (dict(env_reset_timeout_s="60"), "env_reset_timeout_s='60'"),
    ],
)
def test_bad_values_fail_at_validate_naming_the_field(knobs, field):
    with pytest.raises(ValueError) as error:
        StarPOConfig().training(**knobs).validate()
    assert field in str(error.value)


def _numeric_flags():
    from rllib_ragen.jobs.flags import config_flag_names, config_value

    base, structured = StarPOConfig(), {"train_envs", "validation_envs", "lora"}  # JSON, None when unset
    structured |= {"rollout_filter_include_zero"}  # a boolean, or None for the strategy's own
    structured |= {"autocast_dtype"}  # a dtype's name, or None (test_update_precision refuses True)
    structured |= {"rollout_dtype"}  # a dtype's name, or None (the test below refuses True)
    return [
        n
        for n in config_flag_names()
        if n not in structured and not isinstance(config_value(base, n), (bool, str, dict, list, tuple))
    ]


def test_the_samplers_dtype_refuses_a_boolean_naming_its_choices():
    from rllib_ragen.jobs.flags import set_config_value

    config = StarPOConfig()
    set_config_value(config, "rollout_dtype", True)
    with pytest.raises(ValueError, match=r"rollout_dtype=True: choose one of \[None, 'float32', 'bfloat16'\]"):
        config.validate()


@pytest.mark.parametrize("name", _numeric_flags())
def test_every_numeric_setting_refuses_a_boolean(name):
    # lr=True once trained at lr 1.0; num_env_runners=True ran one runner. A boolean is never a number here.
    from rllib_ragen.jobs.flags import set_config_value

    config = StarPOConfig()
    set_config_value(config, name, True)
    with pytest.raises(ValueError, match=f"{name}=True must be"):
        config.validate()


def test_unknown_model_keys_dtypes_and_env_arguments_are_named_with_the_accepted_ones():
    with pytest.raises(
        ValueError,
        match=r"unknown keys \['modle'\]; accepted: "
        r"\['activation_checkpointing', 'critic', 'dtype', 'lora', 'model'",
    ):
        StarPOConfig().rl_module(model_config={"modle": "tiny"}).validate()
    with pytest.raises(ValueError, match=r"'dtype'\]='float8': choose one of \['float32', 'bfloat16', 'float16'\]"):
        StarPOConfig().rl_module(model_config={"dtype": "float8"}).validate()
    with pytest.raises(ValueError, match=r"env_config has unknown keys \['boxes'\].*accepted: \[.*'num_boxes'"):
        StarPOConfig().environment("rllib_ragen/Sokoban-v0", env_config={"boxes": 2}).validate()
    StarPOConfig().environment("rllib_ragen/Sokoban-v0", env_config={"num_boxes": 2}).validate()


def test_the_ungrounded_reasoning_penalty_fails_where_it_could_only_mislead():
    def errors(env="rllib_ragen/Sokoban-v0", train_envs=None, **knobs):
        with pytest.raises(ValueError) as error:
            StarPOConfig().environment(env, train_envs=train_envs).training(**knobs).validate()
        return str(error.value)

    # Positive, it would pay for wrong claims; without <think> there is nothing to check; the bandit checks
    # nothing, so every turn would be charged in full (in a mixture too).
    assert "ungrounded_reasoning_penalty=0.1 must be <= 0" in errors(ungrounded_reasoning_penalty=0.1)
    assert "set enable_thinking=True, or the penalty to 0" in errors(
        ungrounded_reasoning_penalty=-0.1, enable_thinking=False
    )
    assert "['rllib_ragen/Bandit-v0'] check no claims" in errors(
        "rllib_ragen/Bandit-v0", ungrounded_reasoning_penalty=-0.1
    )
    mixture = [{"env": "rllib_ragen/Sokoban-v0", "groups": 2}, {"env": "rllib_ragen/Bandit-v0", "groups": 2}]
    assert "['rllib_ragen/Bandit-v0'] check no claims" in errors(train_envs=mixture, ungrounded_reasoning_penalty=-0.1)
    # Training on environments that check claims is fine, validating on one that does not too (it is not charged).
    StarPOConfig().environment("rllib_ragen/FrozenLake-v0").training(ungrounded_reasoning_penalty=-0.1).validate()
    StarPOConfig().environment(
        validation_envs=[{"env": "rllib_ragen/Sokoban-v0"}, {"env": "rllib_ragen/Bandit-v0"}]
    ).training(ungrounded_reasoning_penalty=-0.1).validate()


@pytest.mark.parametrize("field", ["num_gpus_per_env_runner", "num_gpus_per_learner"])
@pytest.mark.parametrize(
    "value, message",
    [
        (-1, "must be >= 0"),
        (math.nan, "must be a finite number"),
        (math.inf, "must be a finite number"),
        ("1", "must be a finite number"),
        (True, "must be a finite number"),
    ],
)
def test_gpu_counts_fail_at_validate_naming_the_field(field, value, message):
    config = StarPOConfig().env_runners(num_env_runners=1)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=f"{field}={value!r} {message}"):
        config.validate()


def test_sampling_on_a_gpu_the_driver_does_not_have_fails_at_validate(monkeypatch):
    import torch

    config = StarPOConfig().env_runners(num_env_runners=0, num_gpus_per_env_runner=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ValueError,
        match=r"num_gpus_per_env_runner=1 with num_env_runners=0: the driver samples, and "
        r"it sees no CUDA device. Set num_gpus_per_env_runner=0",
    ):
        config.validate()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config.validate()
    # Remote runners get their GPUs from Ray, on whichever node has them: the driver's own devices do not matter.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    StarPOConfig().env_runners(num_env_runners=1, num_gpus_per_env_runner=1).validate()


def test_a_model_that_is_neither_built_in_nor_found_says_so():
    with pytest.raises(OSError, match=r"not a built-in model \('tiny', 'smollm2-135m'\), is no local directory"):
        load_policy("/no/such/model/dir")


@pytest.mark.slow
def test_minus_one_survives_the_build_and_a_checkpoint(ray_session, small_config, tmp_path):
    # RLlib's config state drops every value equal to -1, its "deprecated" marker: the default came back silently.
    # The knobs of turn-aware credit, off their defaults, must survive the same way.
    from rllib_ragen.sentinel import Rule

    credit = dict(
        whiten_advantages=False,
        gamma_turn=0.9,
        gamma_token=0.8,
        gigpo_step_gamma=0.7,
        gigpo_omega=0.5,
        loss_mask="no_think",
        advantage_mask="sampled_and_observations",
        # and the echo-trap knobs, off their defaults
        collapse_diagnostics_interval=3,
        collapse_subsample=4,
        sentinel_max_rollbacks=1,
        env_reset_timeout_s=12.5,
        env_step_timeout_s=7.5,
        sentinel_snapshot_interval=2,
        sentinel_rollback_depth=2,
        importance_weight_cap=3.0,
        sentinel_rules=[Rule("rollout_filter/reward_std", "below", -1.0, action="rollback", knobs={"lr_factor": 0.25})],
    )
    algo = small_config(
        format_penalty=-1.0,
        ineffective_action_penalty=-1.0,
        ungrounded_reasoning_penalty=-1.0,
        validation_interval=0,
        **credit,
    ).build_algo()
    try:
        assert algo.config.format_penalty == -1.0 and algo.env_runner.engine.config.format_penalty == -1.0
        assert algo.env_runner.engine.config.ineffective_action_penalty == -1.0
        assert algo.env_runner.engine.config.ungrounded_reasoning_penalty == -1.0
        assert (
            algo.env_runner.engine.config.env_reset_timeout_s,
            algo.env_runner.engine.config.env_step_timeout_s,
        ) == (12.5, 7.5)
        assert {k: getattr(algo.config, k) for k in credit} == credit
        checkpoint = algo.save_to_path(tmp_path / "checkpoint")
    finally:
        algo.stop()
    restored = StarPO.from_checkpoint(checkpoint)
    try:
        assert restored.config.format_penalty == -1.0 and restored.config.ineffective_action_penalty == -1.0
        assert restored.config.ungrounded_reasoning_penalty == -1.0
        assert {k: getattr(restored.config, k) for k in credit} == credit
        assert restored.sentinel.rules == credit["sentinel_rules"] and restored.sentinel.max_rollbacks == 1
    finally:
        restored.stop()


@pytest.mark.slow
def test_minus_one_survives_tune(ray_session, small_config, tmp_path):
    from ray import tune

    results = tune.Tuner(
        StarPO,
        param_space=small_config(format_penalty=-1.0, validation_interval=0),
        run_config=tune.RunConfig(stop={"training_iteration": 1}, storage_path=str(tmp_path), verbose=0),
    ).fit()
    # The trial's own algorithm reports its config in its result: what the trial ran with, not what Tune was given.
    assert not results.errors and results[0].metrics["config"]["format_penalty"] == -1.0


@pytest.mark.slow
def test_restoring_into_a_config_that_cannot_hold_the_checkpoint_names_the_fields(ray_session, small_config, tmp_path):
    algo = small_config(validation_interval=0).build_algo()  # gae: a separate critic
    try:
        checkpoint = algo.save_to_path(tmp_path / "checkpoint")
    finally:
        algo.stop()
    other = (
        small_config(validation_interval=0, advantage_estimator="grpo")
        .rl_module(model_config={"model": "tiny", "critic": "head"})
        .build_algo()
    )
    try:
        with pytest.raises(ValueError) as error:
            other.restore_from_path(checkpoint)
    finally:
        other.stop()
    message = str(error.value)
    assert "model_config['critic']: checkpoint 'separate', this algorithm 'head'" in message
    assert "advantage_estimator: checkpoint 'gae', this algorithm 'grpo'" in message
    restored = StarPO.from_checkpoint(checkpoint)  # the checkpoint's own settings always fit
    restored.stop()
