"""Settings that passed validate() and then trained on NaN, kept what a filter should drop, or crashed far from
their cause (issue 63): each is now refused at validate(), naming the field and the fix."""

import time

import gymnasium as gym
import pytest

import rllib_ragen  # noqa: F401
from rllib_ragen import StarPOConfig
from rllib_ragen.envs.countdown import MAX_DRAWS


@pytest.mark.parametrize(
    "schedule, message",
    [
        ([[0, 1e-4], [8, float("nan")]], r"the rate nan at timestep 8 must be a finite number > 0"),
        ([[0, 1e-4], [8, -1e-4]], r"the rate -0.0001 at timestep 8"),
        ([[0, 1e-4], [8, float("inf")]], r"the rate inf at timestep 8"),
        ([[0, 1e-4], [8]], r"each tuple in the schedule list must have exctly 2 items"),  # RLlib's own check of shape
    ],
)
def test_a_learning_rate_schedule_with_a_bad_point_is_refused(schedule, message):
    with pytest.raises(ValueError, match=message):
        StarPOConfig().training(lr=schedule).validate()


def test_a_good_learning_rate_schedule_passes():
    StarPOConfig().training(lr=[[0, 1e-4], [8, 1e-5]]).validate()


def test_top_k_abs_keeping_more_groups_than_a_rollout_has_is_refused():
    config = StarPOConfig().training(num_groups=2, rollout_filter="top_k_abs", rollout_filter_value=100)
    with pytest.raises(ValueError, match=r"rollout_filter_value=100 keeps more groups than a rollout has"):
        config.validate()
    StarPOConfig().training(num_groups=2, rollout_filter="top_k_abs", rollout_filter_value=2).validate()


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40])
def test_a_seed_outside_numpys_range_is_refused(seed):
    with pytest.raises(ValueError, match=rf"seed={seed} must lie in \[0, 2\*\*32\)"):
        StarPOConfig().debugging(seed=seed).validate()


@pytest.mark.parametrize(
    "env, env_config, message",
    [
        ("rllib_ragen/SokobanCoordinates-v0", {"dim": 6.5}, r"dim=6.5 must be a whole number from 4 to 20"),
        ("rllib_ragen/SokobanCoordinates-v0", {"num_boxes": 2.5}, r"num_boxes=2.5 must be a whole number"),
        ("rllib_ragen/Sokoban-v0", {"dim": 10**6}, r"dim=1000000 must be a whole number from 4 to 20"),
        ("rllib_ragen/Countdown-v0", {"max_number": 10**30}, r"max_number=1000000000000000000000000000000 must be"),
        ("rllib_ragen/FrozenLake-v0", {"size": 10**6}, r"size=1000000 must be a whole number from 2 to 16"),
        ("rllib_ragen/FrozenLake-v0", {"p": 0.0}, r"p=0.0 \(the chance a cell is frozen\) must lie in \(0, 1\]"),
        (
            "rllib_ragen/Remote-v0",
            {"url": "http://127.0.0.1:9", "request_timeout_s": float("inf")},
            r"request_timeout_s=inf must be a positive, finite number",
        ),
    ],
)
def test_an_environment_argument_of_the_wrong_kind_or_range_is_named_at_validate(env, env_config, message):
    with pytest.raises(ValueError, match=rf"env_config for '{env}': {message}"):
        StarPOConfig().environment(env, env_config=env_config).validate()


def test_countdown_settings_that_draw_no_target_fail_in_bounded_time_instead_of_spinning():
    env = gym.make("rllib_ragen/Countdown-v0", max_number=10**6, max_target=1)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=rf"no Countdown puzzle .* in {MAX_DRAWS:,} draws.*raise max_target"):
        env.reset(seed=0)
    assert time.perf_counter() - t0 < 10


@pytest.mark.parametrize("bad_line", ['{"training_iteration": 2, "env_runners": {', "[1, 2]", '{"no": "iteration"}'])
def test_a_damaged_result_file_is_named_with_its_line(tmp_path, bad_line):
    import json

    from rllib_ragen.jobs.readers import read_results

    good = json.dumps({"training_iteration": 1, "env_runners": {"x": 0.5}})
    (tmp_path / "result.json").write_text(good + "\n" + bad_line + "\n")
    with pytest.raises(ValueError, match=r"result.json, line 2, is not one of Tune's results"):
        read_results(tmp_path)


def test_a_grid_over_the_seed_is_refused_with_the_seeds_flag_to_use(capsys):
    """--grid '{"seed": [1, 2]}' planned two trials and ran one (the job's own seed overwrote the grid)."""
    from rllib_ragen.jobs.flags import parse_job_args
    from tests.test_tuned_examples import job_file

    bandit = job_file("starpo_bandit.py")
    with pytest.raises(SystemExit) as stopped:
        parse_job_args(bandit["config"], bandit["job"], ["--grid", '{"seed": [1, 2]}'])
    assert stopped.value.code == 2 and "give the seeds as seeds (--seeds 1,2)" in capsys.readouterr().err


def test_an_unknown_flag_is_refused_with_the_nearest_flag(capsys):
    from rllib_ragen.jobs.flags import parse_job_args
    from tests.test_tuned_examples import job_file

    bandit = job_file("starpo_bandit.py")
    for argv, words in (
        (["--seeed", "2"], "unrecognized arguments: --seeed 2; --seeed -> did you mean --seed?"),
        (["--group-sise=4"], "--group-sise=4 -> did you mean --group-size?"),
        (["--zzzz"], "unrecognized arguments: --zzzz\n"),
    ):
        with pytest.raises(SystemExit) as stopped:
            parse_job_args(bandit["config"], bandit["job"], argv)
        assert stopped.value.code == 2 and words in capsys.readouterr().err
