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
