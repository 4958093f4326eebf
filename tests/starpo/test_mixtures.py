"""Environment mixtures: train on several environments at once (groups per environment) and validate on another
list (states per environment), with metrics per environment, remote env runners and bit-exact resume."""

import pathlib

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen import StarPOConfig, make_text_env
from rllib_ragen.rollout import RolloutConfig, RolloutEngine, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.models import load_policy

SOKOBAN, ALT, FROZEN = "rllib_ragen/Sokoban-v0", "rllib_ragen/SokobanAltSymbols-v0", "rllib_ragen/FrozenLake-v0"


def mixture(config: StarPOConfig) -> StarPOConfig:
    """Train on one Sokoban and one FrozenLake group per step; validate on two states of three environments."""
    return config.environment(
        train_envs=[{"env": SOKOBAN, "groups": 1}, {"env": FROZEN, "groups": 1}],
        validation_envs=[{"env": SOKOBAN, "states": 2}, {"env": ALT, "states": 2}, {"env": FROZEN, "states": 2}],
    )


def test_groups_are_shared_out_in_order_and_validation_defaults_to_the_training_envs():
    config = StarPOConfig().environment(
        train_envs=[
            {"env": SOKOBAN, "groups": 3},
            {"env": SOKOBAN, "env_config": {"dim": 8}, "name": "sokoban8", "groups": 1},
        ]
    )
    config.training(num_groups=4, validation_size=2, validation_seed_start=50)
    config.validate()
    # env is the first training environment, set by environment(train_envs=...)
    assert (config.env, config.env_config, config.env_name) == (SOKOBAN, {}, SOKOBAN)
    assert config.training_starts([10, 11, 12, 13]) == [(SOKOBAN, 10), (SOKOBAN, 11), (SOKOBAN, 12), ("sokoban8", 13)]
    # No validation_envs: each training environment, validation_size states.
    assert config.validation_starts() == [(SOKOBAN, 50), (SOKOBAN, 51), ("sokoban8", 50), ("sokoban8", 51)]
    assert config.rollout_config().environments == ((SOKOBAN, SOKOBAN, {}), ("sokoban8", SOKOBAN, {"dim": 8}))
    # One environment: bare seeds, as always.
    single = StarPOConfig().training(validation_size=2, validation_seed_start=50)
    assert single.training_starts([10, 11]) == [10, 11] and single.validation_starts() == [50, 51]
    assert single.rollout_config().environments == ()


@pytest.mark.parametrize(
    "train_envs, validation_envs, words",
    [
        (
            [{"env": SOKOBAN, "groups": 6}, {"env": FROZEN, "groups": 1}],
            None,
            "the groups add up to 7, but num_groups=8; set num_groups=7",
        ),
        ([{"env": SOKOBAN, "groups": 8, "group": 2}], None, "train_envs[0] has unknown keys ['group']"),
        ([{"env": SOKOBAN}], None, "train_envs[0] needs 'groups'"),
        ([{"env": SOKOBAN, "groups": 0}], None, "train_envs[0]['groups']=0 must be a positive integer"),
        ([{"env": "Nope-v0", "groups": 8}], None, "train_envs[0]['env']='Nope-v0' is not a registered"),
        (
            [{"env": SOKOBAN, "groups": 8, "env_config": {"dims": 8}}],
            None,
            "train_envs[0]['env_config'] has unknown keys ['dims']",
        ),
        (
            [{"env": SOKOBAN, "groups": 4}, {"env": SOKOBAN, "groups": 4, "env_config": {"dim": 8}}],
            None,
            "the names ['rllib_ragen/Sokoban-v0'] are used twice",
        ),
        (None, [{"env": ALT, "states": 1.5}], "validation_envs[0]['states']=1.5 must be a positive integer"),
        (None, [], "validation_envs=[] must be a non-empty list"),
        (
            [{"env": SOKOBAN, "groups": 8, "name": "s"}],
            [{"env": FROZEN, "name": "s"}],
            "the name 's' stands for two different environments",
        ),
    ],
)
def test_mixture_settings_are_checked_by_name_at_validate(train_envs, validation_envs, words):
    config = StarPOConfig()
    if train_envs is not None:
        config.environment(train_envs=train_envs)
    if validation_envs is not None:
        config.environment(validation_envs=validation_envs)
    with pytest.raises(ValueError, match="Invalid StarPOConfig") as error:
        config.validate()
    assert words in str(error.value)


def test_env_that_is_not_the_first_training_environment_is_refused():
    config = StarPOConfig().environment(train_envs=[{"env": SOKOBAN, "groups": 8}]).environment(FROZEN)
    with pytest.raises(ValueError, match=r"env='rllib_ragen/FrozenLake-v0' .* is not train_envs\[0\]"):
        config.validate()


def test_the_engine_plays_each_group_in_its_own_environment():
    _, tokenizer = load_policy("tiny", seed=0)
    config = RolloutConfig(
        env=SOKOBAN, environments=((SOKOBAN, SOKOBAN, {}), ("big", SOKOBAN, {"dim": 8}), (FROZEN, FROZEN, {}))
    )
    engine = RolloutEngine(
        config, ScriptedBackend(lambda prompt: "<think>go</think><answer>Up</answer>", tokenizer), tokenizer
    )
    starts = [(SOKOBAN, 5), ("big", 5), (FROZEN, 5), (SOKOBAN, 6)]
    trajectories, metrics = engine.rollout(starts, group_size=2, sampling=SamplingParams())
    assert [(t.env_name, t.seed, t.group) for t in trajectories] == [
        (SOKOBAN, 5, 0),
        (SOKOBAN, 5, 0),
        ("big", 5, 1),
        ("big", 5, 1),
        (FROZEN, 5, 2),
        (FROZEN, 5, 2),
        (SOKOBAN, 6, 3),
        (SOKOBAN, 6, 3),
    ]
    # The same seed builds each environment's own first state: a 6x6 and an 8x8 board, and a lake.
    for t, (env, env_config) in zip(trajectories[::2], ((SOKOBAN, {}), (SOKOBAN, {"dim": 8}), (FROZEN, {}))):
        built = make_text_env(env, **env_config)
        observation, _ = built.reset(seed=5)
        assert observation in t.text and built.unwrapped.describe() in t.text
    assert trajectories[0].text != trajectories[2].text
    for name, count in ((SOKOBAN, 4), ("big", 2), (FROZEN, 2)):
        assert metrics[f"{name}/num_trajectories"] == count
    assert metrics["rollout/num_trajectories"] == 8
    # A bare seed still plays config.env.
    alone, _ = engine.rollout([5], group_size=1, sampling=SamplingParams())
    assert alone[0].env_name == SOKOBAN and alone[0].token_ids == trajectories[0].token_ids


@pytest.mark.slow
def test_a_mixture_trains_on_a_remote_runner_with_metrics_per_env_and_resumes_exactly(
    ray_session, tmp_path, small_config, resumed_after_one_iteration, learner_state
):
    make = lambda: mixture(small_config(validation_interval=2)).env_runners(num_env_runners=1).build_algo()  # noqa: E731
    straight = make()
    try:
        results = [straight.train() for _ in range(2)]
        expected_weights = learner_state(straight)
        validation = list(straight.last_validation)
    finally:
        straight.stop()
    for result in results:  # one group of 4 episodes of each training environment, every step
        assert result["env_runners"][f"{SOKOBAN}/num_trajectories"] == 4
        assert result["env_runners"][f"{FROZEN}/num_trajectories"] == 4
        assert f"{ALT}/num_trajectories" not in result["env_runners"]
        # One filter over both environments keeps ceil(0.5 x 2) = 1 group: of one of them, none of the other.
        kept = [result[f"rollout_filter/kept_groups/{name}"] for name in (SOKOBAN, FROZEN)]
        assert sorted(kept) == [0, 1]
    evaluation = results[-1]["evaluation"]["env_runners"]
    for name in (SOKOBAN, ALT, FROZEN):  # two validation states of each validation environment
        assert evaluation[f"{name}/num_trajectories"] == 2 and 0.0 <= evaluation[f"{name}/success"] <= 1.0
    assert sorted((t.env_name, t.seed) for t in validation) == sorted(
        (name, seed) for name in (SOKOBAN, ALT, FROZEN) for seed in (123, 124)
    )

    resumed = resumed_after_one_iteration(make, tmp_path)
    try:
        assert resumed.config.train_envs == mixture(StarPOConfig()).train_envs
        result = resumed.train()
        weights = learner_state(resumed)
    finally:
        resumed.stop()
    assert result["env_runners"]["rollout/return_mean"] == results[-1]["env_runners"]["rollout/return_mean"]
    assert result["evaluation"]["env_runners"][f"{ALT}/success"] == evaluation[f"{ALT}/success"]
    for key in ("actor/pg_loss", "critic/vf_loss"):
        assert result["learners"][DEFAULT_MODULE_ID][key] == results[-1]["learners"][DEFAULT_MODULE_ID][key], key
    for key in weights:  # policy and critic, bit for bit
        assert torch.equal(weights[key], expected_weights[key]), key


@pytest.mark.slow
def test_the_filter_per_environment_keeps_groups_of_each_environment_in_a_real_update(ray_session, small_config):
    algo = mixture(small_config(validation_interval=0, rollout_filter_per_env=True)).build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    # ceil(0.5 x 1) group of each environment; the batch-wide filter would keep ceil(0.5 x 2) = 1 in all.
    assert result["rollout_filter/kept_groups"] == 2 and result["update/kept_trajectories"] == 8
    assert result[f"rollout_filter/kept_groups/{SOKOBAN}"] == result[f"rollout_filter/kept_groups/{FROZEN}"] == 1


def test_a_job_that_validates_only_on_environments_it_does_not_train_on_scores_the_first_of_them(
    ray_session, tmp_path, small_config
):
    # A transfer study: train on one bandit, validate on its held-out-names variant only. The final table, the
    # paired statistics, the baseline and the validation split score the first validation environment; before this,
    # the job trained to the end and then failed to write its summary (it looked for the training environment's
    # validation numbers).
    import json

    import pyarrow.parquet as pq

    from rllib_ragen.jobs.run import JobSettings, headline_environment, run_job
    from rllib_ragen.demonstrators import random_arm_policy

    held_out = "rllib_ragen/BanditHeldOut-v0"
    config = small_config("rllib_ragen/Bandit-v0", max_turns=1, validation_group_size=2).environment(
        train_envs=[{"env": "rllib_ragen/Bandit-v0", "groups": 2}], validation_envs=[{"env": held_out, "states": 6}]
    )
    assert headline_environment(config).name == held_out
    job = JobSettings(output_dir=str(tmp_path), iterations=1, threads=1, warm_start_steps=0)
    summary = run_job(config, job, baselines={"random arm": random_arm_policy(seed=0)})
    run = pathlib.Path(summary["run_dir"])
    assert json.loads((run / "summary.json").read_text())["env"] == summary["env"] == held_out
    after = pq.read_table(run / "validation_rollouts.parquet").to_pylist()
    assert {r["env"] for r in after} == {held_out} and len(after) == 12  # two episodes of each of the six states
    assert summary["after"]["success"] == pytest.approx(sum(r["success"] for r in after) / 12)
    # The paired statistics pair states, each one's episodes averaged: n is 6, not 12.
    assert summary["paired"]["n"] == summary["paired_greedy"]["n"] == 6
    assert summary["paired"]["after"] == summary["after"]["success"]
    played = pq.read_table(run / summary["baselines"]["random arm"]["file"]).to_pylist()
    assert {r["env"] for r in played} == {held_out} and summary["baselines"]["random arm"]["states"] == 6
    # Training never played the held-out names' environment: every state it validates on is unseen there.
    assert summary["validation_splits"]["env"] == held_out and summary["validation_splits"]["training_states"] == 0
    assert summary["validation_splits"]["unseen_states"] == 6
    # The curves (the report's picture, which the viewer shows) draw that environment's validation success.
    import base64

    from rllib_ragen import metrics as M
    from rllib_ragen.jobs.outputs import LEARNING_CURVE, TRAINING
    from rllib_ragen.jobs.readers import read_results
    from rllib_ragen.jobs.curves import validation_points, validations_of

    success = TRAINING + M.env_metric("rllib_ragen/Bandit-v0", M.SUCCESS)
    assert validation_points(validations_of(read_results(run)), success, "rllib_ragen/Bandit-v0", held_out)
    assert base64.b64encode((run / LEARNING_CURVE).read_bytes()).decode() in (run / "rollouts.html").read_text()
