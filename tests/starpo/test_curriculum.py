"""Curriculum stages: each training rollout plays ``env`` with its stage's ``env_config``; validation, and every
iteration after the stages, the ``env_config`` as given."""

import gymnasium as gym
import pytest
import torch

from rllib_ragen import StarPOConfig
from rllib_ragen.rollout.backends import SamplingParams, ScriptedBackend
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.models import load_policy
from rllib_ragen.demonstrators import sokoban_solver_policy

SOKOBAN = "rllib_ragen/Sokoban-v0"
ONE_MOVE = [{"iterations": 1, "env_config": {"max_solution_moves": 1}}]


def test_each_iteration_plays_its_stage_then_env_config_as_given():
    config = StarPOConfig().environment(
        SOKOBAN,
        env_config={"reward": "success"},
        curriculum=[
            {"iterations": 2, "env_config": {"max_solution_moves": 1}},
            {"iterations": 1, "env_config": {"max_solution_moves": 3, "reward": "shaped"}},
        ],
    )
    config.validate()
    assert [config.curriculum_stage(i) for i in range(5)] == [0, 0, 1, 2, 2]
    assert (
        config.training_env_config(0) == config.training_env_config(1) == {"reward": "success", "max_solution_moves": 1}
    )
    assert config.training_env_config(2) == {"reward": "shaped", "max_solution_moves": 3}
    assert config.training_env_config(3) is None and config.env_config == {"reward": "success"}
    plain = StarPOConfig()
    assert plain.curriculum is None and plain.curriculum_stage(7) == 0 and plain.training_env_config(7) is None


@pytest.mark.parametrize(
    "curriculum, words",
    [
        ([], "curriculum=[] must be a non-empty list of stages"),
        ([{"iterations": 2}], "curriculum[0]={'iterations': 2} lacks ['env_config']: a stage is"),
        ([{"iterations": 0}], "curriculum[0]['iterations']=0 must be a positive integer"),  # the zero, not the key
        ([{"iterations": 2, "env_config": {"dim": 5}, "stage": 1}], "has unknown keys ['stage']: a stage is"),
        ([3], "curriculum[0]=3 must be a dict with exactly the keys"),
        ([{"iterations": 0, "env_config": {"dim": 5}}], "curriculum[0]['iterations']=0 must be a positive integer"),
        ([{"iterations": True, "env_config": {"dim": 5}}], "curriculum[0]['iterations']=True must be a positive"),
        (
            [{"iterations": 2, "env_config": {"dim": 5}}, {"iterations": 2, "env_config": {}}],
            "curriculum[1]['env_config']={} must be a non-empty dict",
        ),
        ([{"iterations": 2, "env_config": {"boxes": 2}}], "curriculum[0]['env_config'] has unknown keys ['boxes']"),
        (
            [{"iterations": 2, "env_config": {"max_solution_moves": 0}}],
            "curriculum[0]['env_config'] for 'rllib_ragen/Sokoban-v0': max_solution_moves=0 must be a whole number",
        ),
    ],
)
def test_bad_curricula_fail_at_validate_naming_the_stage(curriculum, words):
    with pytest.raises(ValueError) as error:
        StarPOConfig().environment(SOKOBAN, curriculum=curriculum).validate()
    assert words in str(error.value)


def test_a_curriculum_with_a_mixture_is_refused_with_the_fix():
    config = StarPOConfig().environment(train_envs=[{"env": SOKOBAN, "groups": 8}], curriculum=ONE_MOVE)
    with pytest.raises(ValueError, match="give the easier settings as a train_envs entry of their own"):
        config.validate()


def test_the_engine_builds_the_stage_environment_and_goes_back_to_env_config():
    torch.set_num_threads(1)
    _, tokenizer = load_policy("tiny", seed=0)
    config = StarPOConfig().environment(SOKOBAN, curriculum=ONE_MOVE).training(max_actions_per_episode=25)
    engine = RolloutEngine(config.rollout_config(), ScriptedBackend(sokoban_solver_policy(), tokenizer), tokenizer)
    seeds = list(range(123, 123 + 24))
    plain_lengths = []
    for seed in seeds:
        env = gym.make(SOKOBAN).unwrapped
        env.reset(seed=seed)
        plain_lengths.append(env.optimal_solution_length())
    assert max(plain_lengths) > 1  # the bound changes some levels

    def solver_moves(env_config):
        trajectories, metrics = engine.rollout(seeds, 1, SamplingParams(), env_config=env_config)
        assert metrics[f"{SOKOBAN}/success"] == 1.0  # metrics keep the environment's name
        return [t.num_actions for t in trajectories]

    staged = solver_moves(config.training_env_config(0))
    assert staged == [1] * len(seeds)  # the solver's optimal plans: every stage level is solved in one move
    assert solver_moves(None) == plain_lengths
    assert solver_moves(config.training_env_config(0)) == staged


def test_training_plays_the_stage_then_the_environment_as_given_and_validation_never_the_stage(small_config):
    algo = small_config(validation_interval=0).environment(SOKOBAN, curriculum=ONE_MOVE).build_algo()
    try:
        for iteration, (stage, bound) in enumerate([(0, 1), (1, None)]):
            result = algo.train()
            assert result["env_runners"]["curriculum/stage"] == stage, iteration
            played = _played_observations(algo.last_rollout, max_solution_moves=bound)
            assert played == [True] * len(algo.last_rollout), iteration
            if bound is not None:  # and not the levels of the environment as given
                assert not all(_played_observations(algo.last_rollout, max_solution_moves=None))
        validated = _played_observations(algo.last_validation, max_solution_moves=None)
        assert algo.last_validation and validated == [True] * len(algo.last_validation)
        assert not all(_played_observations(algo.last_validation, max_solution_moves=1))  # other levels
    finally:
        algo.stop()


def _played_observations(trajectories, max_solution_moves):
    """Whether each trajectory opens with its seed's level of Sokoban built with ``max_solution_moves``."""
    env = gym.make(SOKOBAN, **({} if max_solution_moves is None else {"max_solution_moves": max_solution_moves}))
    return [env.reset(seed=t.seed)[0] in t.text for t in trajectories]


@pytest.mark.slow
def test_a_remote_runner_plays_each_stage_beside_the_update_and_a_resumed_run_keeps_its_place(
    ray_session, tmp_path, small_config, resumed_after_one_iteration
):
    """One-step off-policy: iteration 1's rollout is played during iteration 0's update, with iteration 1's stage;
    a run resumed after iteration 0 trains on that same rollout and then plays the environment as given."""
    curriculum = [
        {"iterations": 1, "env_config": {"max_solution_moves": 1}},
        {"iterations": 1, "env_config": {"max_solution_moves": 2}},
    ]
    make = lambda: (
        small_config(validation_interval=0, max_policy_lag=1)
        .environment(  # noqa: E731
            SOKOBAN, curriculum=curriculum
        )
        .env_runners(num_env_runners=1)
        .build_algo()
    )
    straight = make()
    try:
        for stage, bound in [(0, 1), (1, 2), (2, None)]:
            result = straight.train()
            assert result["env_runners"]["curriculum/stage"] == stage
            assert all(_played_observations(straight.last_rollout, max_solution_moves=bound)), stage
        expected = [t.token_ids for t in straight.last_rollout]
    finally:
        straight.stop()
    resumed = resumed_after_one_iteration(make, tmp_path)
    try:
        assert resumed.train()["env_runners"]["curriculum/stage"] == 1
        assert all(_played_observations(resumed.last_rollout, max_solution_moves=2))
        assert resumed.train()["env_runners"]["curriculum/stage"] == 2
        assert [t.token_ids for t in resumed.last_rollout] == expected
    finally:
        resumed.stop()


def test_the_job_flag_sets_the_stages_and_the_plan_line_states_them():
    from rllib_ragen.jobs.flags import parse_job_args
    from rllib_ragen.jobs.run import JobSettings
    from rllib_ragen.jobs.console import _curriculum_plan

    flag = '[{"iterations": 20, "env_config": {"max_solution_moves": 2}}, {"iterations": 10, "env_config": {"dim": 5}}]'
    config, job = parse_job_args(
        StarPOConfig().environment(SOKOBAN), JobSettings(iterations=80), ["--curriculum", flag]
    )
    assert config.curriculum == [
        {"iterations": 20, "env_config": {"max_solution_moves": 2}},
        {"iterations": 10, "env_config": {"dim": 5}},
    ]
    assert _curriculum_plan(config, job.iterations) == (
        ' (curriculum: iterations 1-20 on {"max_solution_moves": 2}, 21-30 on {"dim": 5}; then env_config as given)'
    )
    assert _curriculum_plan(config, 30).endswith(
        "; the run's 30 iterations end before env_config as given is ever trained on)"
    )
    assert _curriculum_plan(StarPOConfig(), 30) == ""
    # A curriculum given in a grid variant gets its own plan line; a variant with the config's own gets none.
    from rllib_ragen.jobs.console import _variant_curriculum_plans

    grid = {
        "variant": {
            "plain": {},
            "easy_first": {"curriculum": [{"iterations": 40, "env_config": {"max_solution_moves": 3}}]},
        }
    }
    assert _variant_curriculum_plans(StarPOConfig().environment(SOKOBAN), JobSettings(iterations=80, grid=grid)) == [
        'grid variant easy_first: curriculum: iterations 1-40 on {"max_solution_moves": 3}; then env_config as given'
    ]
    no_curriculum = JobSettings(iterations=80, grid={"variant": {"none": {"curriculum": None}}})
    assert _variant_curriculum_plans(config, no_curriculum) == ["grid variant none: no curriculum"]
    with pytest.raises(SystemExit):  # a bad stage exits at parse time, naming it (validate()'s message)
        parse_job_args(StarPOConfig().environment(SOKOBAN), JobSettings(), ["--curriculum", '[{"iterations": 0}]'])


def test_a_stage_that_can_never_reset_ends_the_run_naming_the_stage_and_the_first_error(small_config):
    """The stage's settings validate (a level is drawn only at reset), but no 5x5 level with two boxes is solved in
    one move: every reset of the stage fails, and the run's error says where and why, not only that it happened."""
    stage = [{"iterations": 1, "env_config": {"num_boxes": 2, "max_solution_moves": 1}}]
    algo = (
        small_config(validation_interval=0, validate_before_training=False)
        .environment(SOKOBAN, env_config={"dim": 5}, curriculum=stage)
        .build_algo()
    )
    try:
        with pytest.raises(RuntimeError) as error:
            algo.train()
    finally:
        algo.stop()
    message = str(error.value)
    assert "every episode of iteration 1's training rollout of rllib_ragen/Sokoban-v0" in message
    assert "in curriculum stage 1 of 1 (curriculum[0], env_config {'dim': 5, 'num_boxes': 2, " in message
    assert "(8 env errors)" in message and "the first: env reset failed for seed " in message
    assert ": RuntimeError: no level of 1000 drawn (dim=5, num_boxes=2" in message and ".." not in message
