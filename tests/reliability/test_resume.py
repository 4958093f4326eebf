"""Main jobs checkpoint as they go and ``--resume`` continues a crashed run exactly where its checkpoint left it."""

import json
import pathlib
import time

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen import StarPOConfig
from rllib_ragen.jobs.run import JobSettings, run_job
from rllib_ragen.jobs.outputs import changed_settings, start_run_folder
from rllib_ragen.jobs.readers import read_results


def test_resume_without_a_run_fails_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="resume=True: there is no Tune experiment to continue"):
        run_job(StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path / "job"), resume=True))
    assert not (tmp_path / "job").exists()
    with pytest.raises(ValueError, match="resume=True: there is no Tune experiment to continue"):
        run_job(
            StarPOConfig().environment("Nope-v0"),
            JobSettings(output_dir=str(tmp_path / "job"), run_name="a", resume=True),
        )
    assert not (tmp_path / "job").exists()


def test_resuming_with_other_settings_is_refused_naming_them(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    job = JobSettings(output_dir=str(tmp_path), run_name="run")
    start_run_folder(run, StarPOConfig().training(lr=3e-4), job)
    resumed = JobSettings(**{**vars(job), "resume": True})
    start_run_folder(run, StarPOConfig().training(lr=3e-4), resumed)  # the same settings: fine
    with pytest.raises(ValueError, match=r"lr 0.0003 -> 0.0001; num_groups 8 -> 4; iterations 20 -> 25\."):
        start_run_folder(
            run, StarPOConfig().training(lr=1e-4, num_groups=4), JobSettings(**{**vars(resumed), "iterations": 25})
        )
    recorded = json.loads((run / "run_config.json").read_text())
    assert recorded["config"]["lr"] == 3e-4 and len(recorded["resumed"]) == 1  # the refused resume left no trace


def test_changed_settings_compares_values_as_they_are_stored():
    nan = float("nan")
    assert changed_settings({"a": nan, "b": {"x": 1, "y": 2}}, {"a": float("nan"), "b": {"y": 2, "x": 1}}) == {}
    assert changed_settings({"a": 1, "b": 2}, {"a": 1.5, "c": 3}) == {"a": [1, 1.5], "b": [2, None], "c": [None, 3]}


def crash_once_at_iteration_2(marker: pathlib.Path):
    """An ``on_train_result`` callback that raises in the trial's second iteration once (the marker file remembers),
    as a dying worker would stop it. A closure, so Ray ships it by value to the trial's worker."""

    def on_train_result(*, algorithm, result, **kwargs):
        if algorithm.iteration == 2 and not marker.exists():
            marker.write_text("crashed")
            raise RuntimeError("simulated crash")

    return on_train_result


@pytest.mark.slow
def test_a_crashed_job_resumes_through_tune_and_ends_as_if_never_stopped(ray_session, small_config, tmp_path):
    # Validated every iteration: the validation before RL, in the crashed session, is still the report's "before"
    # (a resumed run once reported it as null, and a run that passed its bar as failing).
    config = small_config(validation_interval=1)
    job = JobSettings(iterations=3, checkpoint_interval=1, warm_start_steps=0, threads=1)
    whole = run_job(config, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "whole")}))
    crashing = config.copy(copy_frozen=False).callbacks(
        on_train_result=crash_once_at_iteration_2(tmp_path / "crashed.marker")
    )
    with pytest.raises(RuntimeError, match="1 of 1 trials failed.*--resume"):
        run_job(crashing, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "crashed")}))
    crashed = (tmp_path / "crashed" / "latest").resolve() / "seed7"
    assert [r["training_iteration"] for r in read_results(crashed)] == [1]  # iteration 2 never reported
    # --resume with the job's folder continues the experiment its "latest" link points at, through Tuner.restore.
    resumed = run_job(crashing, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "crashed"), "resume": True}))
    assert resumed["run_dir"] == str(crashed)
    # Same seeds, same weights, same optimizer state: the resumed run's numbers are the uninterrupted run's.
    columns = [
        "training_iteration",
        "env_runners/episode_return_mean",
        "learners/default_policy/actor/pg_loss",
        "learners/default_policy/actor/entropy",
    ]
    assert [[r[c] for c in columns] for r in read_results(crashed)] == [
        [r[c] for c in columns] for r in read_results(pathlib.Path(whole["run_dir"]))
    ]
    assert resumed["before"] == whole["before"] and resumed["after"] == whole["after"]
    assert all(value == value for value in resumed["before"].values())  # measured: no NaN
    assert resumed["validated_at"] == whole["validated_at"] == [0, 1, 2, 3]
    assert resumed["paired"] == whole["paired"] and resumed["paired_greedy"] == whole["paired_greedy"]
    assert len(json.loads((crashed.parent / "run_config.json").read_text())["resumed"]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("case", ["into the running algorithm", "while the runner is busy"])
def test_the_env_runner_plays_the_restored_weights(case, ray_session, small_config, tmp_path):
    """Before the fix the runner kept other weights than the restored learner's, and the next rollout played them:
    it refused the checkpoint's older version, or RLlib's sync to it was dropped (a loaded machine's slow runner;
    seen as a resume that was not bit-exact in CI)."""
    make = lambda: small_config(validation_interval=0).env_runners(num_env_runners=1).build_algo()  # noqa: E731
    algo = make()
    try:
        algo.train()
        checkpoint = algo.save_to_path(tmp_path / "checkpoint")  # weights version 1
        if case == "into the running algorithm":  # as Tune's PBT does: the runner is at version 2 by then
            algo.train()
        else:  # a new algorithm (version 0) whose runner is still busy with a request: RLlib drops the next one
            algo.stop()
            algo = make()
            group = algo.env_runner_group
            group.fetch_ready_async_reqs(timeout_seconds=None)  # the build's own requests, done
            assert group.foreach_env_runner_async(lambda runner: time.sleep(2.0), tag="set_state") == 1
        algo.restore_from_path(checkpoint)
        learner = algo.learner_group._learner.module[DEFAULT_MODULE_ID].get_state(inference_only=True)
        [(version, played)] = algo.env_runner_group.foreach_env_runner(
            lambda runner: (runner.weights_seq_no, runner.module.get_state()), local_env_runner=False
        )
    finally:
        algo.stop()
    assert version == 1
    assert played.keys() == learner.keys()
    for key, value in learner.items():
        assert torch.equal(torch.as_tensor(played[key]), value), key


@pytest.mark.slow
def test_a_learning_rate_changed_on_resume_drives_the_first_resumed_update(ray_session, small_config, tmp_path):
    first = small_config(validation_interval=0, lr=1e-3, critic_lr=2e-3).build_algo()
    try:
        first.train()
        checkpoint = first.save_to_path(tmp_path / "checkpoint")
    finally:
        first.stop()
    resumed = small_config(validation_interval=0, lr=5e-4, critic_lr=2e-3).build_algo()
    try:
        resumed.restore_from_path(checkpoint)  # the optimizer state saved at lr 1e-3
        rates = {
            name: optimizer.param_groups[0]["lr"]
            for name, optimizer in resumed.learner_group._learner._named_optimizers.items()
        }
    finally:
        resumed.stop()
    assert rates == {f"{DEFAULT_MODULE_ID}_actor": 5e-4, f"{DEFAULT_MODULE_ID}_critic": 2e-3}
