"""Dead workers: a remote env runner killed in the middle of a training run is restarted and the run goes on; a
killed remote learner stops the run with an error that names it, on every later call too."""

import pytest
import ray
import torch

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


@pytest.mark.parametrize(
    "resources, asked, available",
    [
        (dict(num_learners=3), "asks for 3 CPU", "has 2 CPU"),  # three learners of one CPU each, on a 2-CPU Ray
        (dict(num_learners=1, num_gpus_per_learner=1), "asks for 1 GPU", "has 0 GPU"),
    ],
)
def test_actors_the_cluster_cannot_place_fail_at_build_naming_asked_and_available(
    ray_session, small_config, resources, asked, available
):
    # Before, learners that could not all be placed waited for each other for more than 10 minutes, with no error.
    gpus = resources.pop("num_gpus_per_learner", 0)
    config = small_config(num_groups=3, rollout_filter_ratio=1.0).learners(**resources, num_gpus_per_learner=gpus)
    with pytest.raises(ValueError) as error:
        config.build_algo()
    message = str(error.value)
    assert asked in message and f"the Ray cluster {available}" in message and "num_learners" in message


@pytest.mark.parametrize("entry_point", ["import path", "class"])
def test_an_environment_registered_only_in_the_driver_plays_on_remote_env_runners(
    ray_session, small_config, entry_point
):
    from rllib_ragen.envs import BanditEnv, register_text_env

    # Only this process knows the id: Ray's worker processes import rllib_ragen, not this registration. Before,
    # the build failed with RLlib's IndexError, and the cause (NamespaceNotFound) stayed in the worker's log.
    env_id = f"driveronly/{'Path' if entry_point == 'import path' else 'Class'}Bandit-v0"
    register_text_env(
        env_id,
        "rllib_ragen.envs.bandit:BanditEnv" if entry_point == "import path" else BanditEnv,
        high_risk_name="Comet",
    )
    algo = small_config(env_id, max_turns=1).env_runners(num_env_runners=1).build_algo()
    try:
        algo.train()
        played = [trajectory.text for trajectory in algo.last_rollout]  # sampled on the remote runner
    finally:
        algo.stop()
    assert len(played) == 8 and all("Comet" in text for text in played)


def kill_the_learner_once_at_iteration_2(marker):
    """An ``on_train_result`` callback that kills the remote learner's process after iteration 2 once (the marker
    remembers), as a lost node would: iteration 2's checkpoint, which reads the learner's state, fails."""

    def on_train_result(*, algorithm, result, **kwargs):
        if algorithm.iteration == 2 and not marker.exists():
            marker.write_text("killed")
            manager = algorithm.learner_group._worker_manager
            ray.kill(manager._actors[manager.actor_ids()[0]], no_restart=True)

    return on_train_result


def test_a_lost_learner_is_survived_by_tune_restarting_the_trial_from_its_checkpoint(
    ray_session, small_config, tmp_path
):
    import pathlib

    from safetensors.torch import load_file

    from rllib_ragen.jobs.run import JobSettings, run_job
    from rllib_ragen.jobs.outputs import POLICY
    from rllib_ragen.jobs.readers import read_results

    config = small_config(validation_interval=0).learners(num_learners=1)
    job = JobSettings(iterations=3, checkpoint_interval=1, warm_start_steps=0, threads=1, max_failures=1)
    twin = run_job(config, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "twin")}))
    killed = run_job(
        config.copy(copy_frozen=False).callbacks(
            on_train_result=kill_the_learner_once_at_iteration_2(tmp_path / "killed.marker")
        ),
        JobSettings(**{**vars(job), "output_dir": str(tmp_path / "killed")}),
    )
    assert (tmp_path / "killed.marker").exists()
    trial, twin_trial = (pathlib.Path(run["run_dir"]) for run in (killed, twin))
    # The trial failed (Tune kept the error), and its FailureConfig restarted it from the last checkpoint
    # (iteration 1's), which played iterations 2 and 3 again.
    assert "killed by `ray.kill`" in (trial / "error.txt").read_text()
    assert [r["training_iteration"] for r in read_results(trial)] == [1, 2, 3]
    assert killed["after"] == twin["after"]
    policy, twin_policy = (load_file(t / POLICY / "model.safetensors") for t in (trial, twin_trial))
    assert all(torch.equal(policy[k], twin_policy[k]) for k in twin_policy)
