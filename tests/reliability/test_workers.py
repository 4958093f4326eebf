"""Dead workers: a remote env runner killed in the middle of a training run is restarted and the run goes on; a
killed remote learner stops the run with an error that names it, on every later call too."""

import pytest
import ray

from rllib_ragen.starpo import LearnerDiedError

pytestmark = pytest.mark.slow


def test_a_killed_env_runner_is_restarted_and_the_run_finishes_all_iterations(ray_session, small_config):
    algo = small_config(validation_interval=0).env_runners(num_env_runners=1).build_algo()
    try:
        first = algo.train()
        # Kill the runner's process as a crash would (Ray may restart the process, RLlib must notice and resync it):
        # the next rollout's call to it fails mid-iteration.
        ray.kill(algo.env_runner_group._worker_manager._actors[1], no_restart=False)
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    assert first["env_runners"]["rollout/env_runner_restarts"] == 0
    assert results[0]["env_runners"]["rollout/env_runner_restarts"] == 1  # the failed rollout, played again
    assert results[1]["env_runners"]["rollout/env_runner_restarts"] == 0
    assert [r["training_iteration"] for r in results] == [2, 3]
    assert all(r["env_runners"]["num_episodes"] == 8 for r in results)  # every group, none lost


def test_a_killed_remote_learner_is_named_on_this_and_every_later_call(ray_session, small_config):
    algo = small_config(validation_interval=0).learners(num_learners=1).build_algo()
    try:
        algo.train()
        manager = algo.learner_group._worker_manager
        ray.kill(manager._actors[manager.actor_ids()[0]], no_restart=True)
        for _ in range(2):  # RLlib alone: ActorDiedError, then an IndexError (or an update of no learner at all)
            with pytest.raises(LearnerDiedError, match=r"remote learner\(s\) \[\d+\] of 1 died .*--resume"):
                algo.train()
    finally:
        algo.stop()


@pytest.mark.parametrize("resources, asked, available", [
    (dict(num_learners=3), "asks for 3 CPU", "has 2 CPU"),  # three learners of one CPU each, on a 2-CPU Ray
    (dict(num_learners=1, num_gpus_per_learner=1), "asks for 1 GPU", "has 0 GPU"),
])
def test_actors_the_cluster_cannot_place_fail_at_build_naming_asked_and_available(ray_session, small_config,
                                                                                  resources, asked, available):
    # Before, learners that could not all be placed waited for each other for more than 10 minutes, with no error.
    gpus = resources.pop("num_gpus_per_learner", 0)
    config = small_config(num_groups=3, rollout_filter_ratio=1.0).learners(**resources, num_gpus_per_learner=gpus)
    with pytest.raises(ValueError) as error:
        config.build_algo()
    message = str(error.value)
    assert asked in message and f"the Ray cluster {available}" in message and "num_learners" in message


@pytest.mark.parametrize("entry_point", ["import path", "class"])
def test_an_environment_registered_only_in_the_driver_plays_on_remote_env_runners(ray_session, small_config,
                                                                                   entry_point):
    from rllib_ragen.envs import BanditEnv, register_text_env

    # Only this process knows the id: Ray's worker processes import rllib_ragen, not this registration. Before,
    # the build failed with RLlib's IndexError, and the cause (NamespaceNotFound) stayed in the worker's log.
    env_id = f"driveronly/{'Path' if entry_point == 'import path' else 'Class'}Bandit-v0"
    register_text_env(env_id, "rllib_ragen.envs.bandit:BanditEnv" if entry_point == "import path" else BanditEnv,
                      high_risk_name="Comet")
    algo = small_config(env_id, max_turns=1).env_runners(num_env_runners=1).build_algo()
    try:
        algo.train()
        played = [trajectory.text for trajectory in algo.last_rollout]  # sampled on the remote runner
    finally:
        algo.stop()
    assert len(played) == 8 and all("Comet" in text for text in played)
