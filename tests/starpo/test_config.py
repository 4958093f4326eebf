"""StarPOConfig: defaults, presets, and errors that name the fields to change. No Ray session needed."""

import pytest

from rllib_ragen import StarPO, StarPOConfig
from rllib_ragen.starpo.llm_rl_module import CausalLMRLModule
from rllib_ragen.starpo.starpo_learner import StarPOTorchLearner
from rllib_ragen.starpo.text_env_runner import TextEnvRunner


def test_defaults_are_the_reference_starpo_s():
    c = StarPOConfig()
    assert (c.num_groups, c.group_size, c.rollout_filter, c.rollout_filter_ratio) == (8, 16, "std", 0.25)
    assert (c.clip_ratio_low, c.clip_ratio_high, c.dual_clip, c.kl_coeff) == (0.2, 0.28, 3.0, 0.0)
    assert (c.advantage_estimator, c.gamma, c.lambda_, c.entropy_coeff) == ("gae", 1.0, 1.0, 0.001)
    assert (c.lr, c.critic_lr, c.weight_decay, c.grad_clip) == (1e-6, 1e-5, 0.01, 1.0)
    assert (c.temperature, c.validation_temperature, c.max_new_tokens_per_turn) == (1.0, 0.5, 400)
    assert (c.max_turns, c.max_actions_per_turn, c.max_actions_per_episode) == (5, 5, 10)
    assert (c.validation_interval, c.validation_size, c.loss_aggregation) == (10, 256, "token-mean")
    assert c.kept_batch_size == 32 and c.effective_updates_per_rollout_batch == 1  # one step per rollout
    assert c.algo_class is StarPO and c.env_runner_cls is TextEnvRunner
    assert c.get_default_learner_class() is StarPOTorchLearner
    assert c.get_default_rl_module_spec().module_class is CausalLMRLModule
    assert c.model_config["model"] == "tiny" and c.model_config["value_function"] is True


def test_model_config_merges_over_defaults_and_tracks_the_estimator():
    c = StarPOConfig().rl_module(model_config={"model": "smollm2-135m"}).training(advantage_estimator="grpo")
    assert c.model_config["model"] == "smollm2-135m" and c.model_config["dtype"] == "float32"
    assert c.model_config["value_function"] is False  # no critic is built for GRPO


def test_presets():
    vanilla = StarPOConfig().preset("starpo")
    assert (vanilla.kl_coeff, vanilla.clip_ratio_high, vanilla.rollout_filter) == (0.001, 0.2, "none")
    assert vanilla.kept_batch_size == 128
    back = vanilla.preset("starpo-s")
    assert (back.kl_coeff, back.clip_ratio_high, back.rollout_filter, back.rollout_filter_ratio) == (
        0.0,
        0.28,
        "std",
        0.25,
    )
    with pytest.raises(ValueError, match="starpo-s"):
        StarPOConfig().preset("ppo")


@pytest.mark.parametrize(
    "knobs, fields",
    [
        (
            dict(num_groups=8, group_size=4, rollout_filter_ratio=0.25, minibatch_size=16),
            ["minibatch_size=16", "num_groups=8", "rollout_filter_ratio=0.25", "group_size=4"],
        ),
        (dict(advantage_estimator="ppo"), ["advantage_estimator='ppo'", "gae", "grpo"]),
        (dict(advantage_estimator="grpo", group_size=1), ["advantage_estimator='grpo'", "group_size"]),
        (dict(rollout_filter="top"), ["rollout_filter='top'", "reversed_std"]),
        (dict(rollout_filter_ratio=0.0), ["rollout_filter_ratio=0.0"]),
        (dict(dual_clip=0.5), ["dual_clip=0.5"]),
        (dict(loss_aggregation="sum"), ["loss_aggregation='sum'", "seq-mean-token-mean"]),
        (dict(temperature=0.0), ["temperature=0.0"]),
        (dict(updates_per_rollout_batch=64, num_groups=8, group_size=4), ["updates_per_rollout_batch=64"]),
        (dict(minibatch_size=8, updates_per_rollout_batch=3), ["minibatch_size=8", "updates_per_rollout_batch=3"]),
        (dict(group_size=0), ["group_size=0"]),
        (dict(independent_transitions="yes"), ["independent_transitions='yes'", "True or False"]),
        # Each of these reached the first train() or trained silently before (a ZeroDivisionError, a bare TypeError,
        # +5 per broken reply).
        (dict(minibatch_size=0), ["minibatch_size=0 must be >= 1"]),
        (dict(minibatch_size=-1), ["minibatch_size=-1 must be >= 1"]),
        (dict(minibatch_size=float("nan")), ["minibatch_size=nan must be an integer"]),
        (dict(adam_betas="x"), ["adam_betas='x' must be two numbers in [0, 1)"]),
        (dict(adam_betas=(0.9,)), ["adam_betas=(0.9,)"]),
        (dict(adam_betas=(0.9, True)), ["adam_betas=(0.9, True)"]),
        (dict(format_penalty=5.0), ["format_penalty=5.0 must be <= 0"]),
        (dict(ineffective_action_penalty=0.1), ["ineffective_action_penalty=0.1 must be <= 0"]),
        (dict(env_step_timeout_s=0), ["env_step_timeout_s=0 must be > 0 seconds"]),
        (dict(env_reset_timeout_s=-1.0), ["env_reset_timeout_s=-1.0 must be > 0 seconds"]),
        # RAGEN's filter strategies
        (dict(rollout_filter="top_p"), ["rollout_filter='top_p' needs rollout_filter_value"]),
        (dict(rollout_filter="top_p", rollout_filter_value=1.5), ["rollout_filter_value=1.5 must lie in (0, 1]"]),
        (
            dict(rollout_filter="top_k_abs", rollout_filter_value=2.5),
            ["rollout_filter_value=2.5 must be a whole number"],
        ),
        (
            dict(rollout_filter="top_p", rollout_filter_value=True),
            ["rollout_filter_value=True must be a finite number"],
        ),
        (
            dict(rollout_filter_value=0.9),
            ["rollout_filter_value=0.9 set RAGEN's filter strategies", "rollout_filter='std'"],
        ),
        (dict(rollout_filter="snr_adaptive", rollout_filter_include_zero=True), ["drops zero-variance groups"]),
        (
            dict(rollout_filter="top_p", rollout_filter_value=0.9, rollout_filter_include_zero=1),
            ["rollout_filter_include_zero=1 must be True, False or None"],
        ),
        (dict(rollout_filter="min_p", rollout_filter_value=0.5, group_size=1), ["group_size >= 2"]),
        (
            dict(rollout_filter="top_p", rollout_filter_value=0.9, rollout_filter_type="biggest"),
            ["rollout_filter_type='biggest'", "largest"],
        ),
        (
            dict(rollout_filter="top_k", rollout_filter_value=0.5, rollout_filter_top_p_mode="softmax"),
            ["rollout_filter_top_p_mode='softmax' applies to rollout_filter='top_p' only"],
        ),
        (dict(rollout_filter_empty_stop_steps=0), ["rollout_filter_empty_stop_steps=0 must be a positive integer"]),
        # context windows
        (dict(context_window="last_k_turns"), ["context_window='last_k_turns' needs context_window_turns >= 2"]),
        (dict(context_window="last_k_turns", context_window_turns=1), ["context_window='single_turn'"]),
        (dict(context_window_turns=3), ["context_window_turns=3 applies to context_window='last_k_turns' only"]),
        (dict(context_window="window"), ["context_window='window'", "single_turn"]),
        (
            dict(context_window="single_turn", advantage_mask="sampled_and_observations"),
            ["advantage_mask='sampled_and_observations'", "context_window='single_turn'"],
        ),
    ],
)
def test_invalid_settings_fail_at_validate_naming_the_fields(knobs, fields):
    config = StarPOConfig().training(**knobs)
    with pytest.raises(ValueError) as error:
        config.validate()
    for field in fields:
        assert field in str(error.value)


def test_unknown_env_and_critic_are_named():
    with pytest.raises(ValueError, match="env='Nope-v0'.*register_text_env"):
        StarPOConfig().environment("Nope-v0").validate()
    with pytest.raises(ValueError, match=r"model_config\['critic'\]='shared'"):
        StarPOConfig().rl_module(model_config={"critic": "shared"}).validate()
    with pytest.raises(ValueError, match="num_env_runners=4"):
        StarPOConfig().training(num_groups=2).env_runners(num_env_runners=4).validate()


def test_a_valid_config_passes():
    StarPOConfig().environment("rllib_ragen/FrozenLake-v0").training(minibatch_size=16).validate()
    assert StarPOConfig().training(minibatch_size=16).effective_updates_per_rollout_batch == 2
    assert StarPOConfig().training(independent_transitions=True).rollout_config().independent_transitions is True


def test_every_starpo_knob_is_a_documented_keyword_of_training():
    import inspect

    from rllib_ragen.starpo.config import STARPO_S_DEFAULTS

    keywords = set(inspect.signature(StarPOConfig.training).parameters) - {"self", "kwargs"}
    assert keywords == set(STARPO_S_DEFAULTS)  # settable by name, so a typo fails instead of being ignored
    assert [k for k in STARPO_S_DEFAULTS if k not in StarPOConfig.training.__doc__] == []
    with pytest.raises(TypeError, match="num_group"):
        StarPOConfig().training(num_group=4)


def test_building_the_module_logs_no_deprecation_notice():
    import subprocess
    import sys

    # RLlib logs this once per process, so a fresh one: RLModule's own __init__ builds the deprecated config.
    code = (
        "from ray.rllib.core import DEFAULT_MODULE_ID\n"
        "from rllib_ragen import StarPOConfig\n"
        "from rllib_ragen.starpo.llm_rl_module import PLACEHOLDER_SPACE\n"
        "StarPOConfig().get_rl_module_spec(spaces={DEFAULT_MODULE_ID: (PLACEHOLDER_SPACE, PLACEHOLDER_SPACE)})"
        ".build()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "deprecated" not in done.stderr, done.stderr[-2000:]


def test_every_boolean_knob_survives_copy_dict_and_checkpoint_state():
    from rllib_ragen.starpo.knobs import BOOL, KNOBS

    _BOOLEANS = [knob.name for knob in KNOBS.values() if knob.kind == BOOL and not knob.optional]
    config = StarPOConfig()
    flipped = {knob: not getattr(config, knob) for knob in _BOOLEANS}
    config.training(**flipped)
    # get_state/from_state is what an RLlib checkpoint stores and restores the config with.
    for restored in (
        config.copy(),
        StarPOConfig.from_dict(config.to_dict()),
        StarPOConfig.from_state(config.get_state()),
    ):
        assert {knob: getattr(restored, knob) for knob in _BOOLEANS} == flipped


def test_a_filter_keeping_a_varying_number_of_groups_needs_one_learner():
    config = StarPOConfig().training(rollout_filter="snr_adaptive").learners(num_learners=2)
    with pytest.raises(ValueError, match="varies from rollout to rollout.*use one learner"):
        config.validate()
    # A fixed count splits over learners as std's does: top_k_abs 4 of 8 groups over 2 learners.
    fixed = StarPOConfig().training(rollout_filter="top_k_abs", rollout_filter_value=4)
    assert fixed.num_kept_groups == 4 and fixed.kept_batch_size == 64
    assert StarPOConfig().training(rollout_filter="top_p", rollout_filter_value=0.9).kept_batch_size is None


def test_the_settings_objects_of_a_default_config_are_their_own_defaults():
    """A knob that RolloutConfig, AdvantageSettings or FilterSettings also holds takes its default from that class
    (stated once): a default config builds each of them equal to the class's own defaults."""
    import dataclasses

    from rllib_ragen.objectives import AdvantageSettings, FilterSettings
    from rllib_ragen.rollout import RolloutConfig

    config = StarPOConfig()
    rollout = config.rollout_config()
    assert dataclasses.replace(rollout, env=RolloutConfig.env, env_config={}, environments=()) == RolloutConfig()
    assert config.advantage_settings() == AdvantageSettings()
    assert config.filter_settings() == FilterSettings()


def test_without_an_action_separator_a_reply_holds_one_action():
    with pytest.raises(
        ValueError,
        match=r"action_separator=None makes each answer one action, but "
        r"max_actions_per_turn=5: set max_actions_per_turn=1",
    ):
        StarPOConfig().training(action_separator=None).validate()
    with pytest.raises(ValueError, match=r"action_separator='<or>' must be a short string"):
        StarPOConfig().training(action_separator="<or>").validate()
    config = StarPOConfig().training(action_separator=None, max_actions_per_turn=1)
    config.validate()
    assert config.rollout_config().action_separator is None
    assert StarPOConfig().rollout_config().action_separator == "||"  # RAGEN's, by default
