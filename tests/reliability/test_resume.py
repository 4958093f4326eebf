"""Main jobs checkpoint as they go and ``--resume`` continues a crashed run exactly where its checkpoint left it."""

import csv
import json
import pathlib
import time

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen import StarPO, StarPOConfig
from rllib_ragen.experiment import JobSettings, run_job
from rllib_ragen.experiment_outputs import changed_settings, start_run_folder


def test_resume_without_a_run_or_a_checkpoint_fails_before_any_work(tmp_path):
    with pytest.raises(FileNotFoundError, match="--resume: .* holds no run to continue"):
        run_job(StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path / "job"), resume=True))
    assert not (tmp_path / "job").exists()
    with pytest.raises(FileNotFoundError, match="--resume: there is no checkpoint at"):
        run_job(StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path / "job"), run_name="a",
                                                                   resume=True))
    assert not (tmp_path / "job").exists()


def test_a_named_run_never_overwrites_an_earlier_runs_checkpoint(tmp_path):
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / "rllib_checkpoint.json").write_text("{}")
    with pytest.raises(FileExistsError, match="Continue it with --resume"):
        run_job(StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path), run_name="run"))
    assert (tmp_path / "run" / "checkpoint" / "rllib_checkpoint.json").read_text() == "{}"


def test_a_second_run_gets_its_own_folder_and_leaves_the_first_alone(tmp_path):
    first = tmp_path / "20260101-000000_seed0"
    (first / "checkpoint").mkdir(parents=True)
    (first / "metrics.csv").write_text("training_iteration\n1\n")
    (tmp_path / "latest").symlink_to(first.name)
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    # The environment does not exist: the run stops at build, after its folder was made.
    with pytest.raises(ValueError, match="Nope-v0"):
        run_job(StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path)))
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
    second = (tmp_path / "latest").resolve()
    assert second != first.resolve() and second.parent == tmp_path.resolve() and second.name.endswith("_seed0")
    recorded = json.loads((second / "run_config.json").read_text())
    assert recorded["config"]["env"] == "Nope-v0" and recorded["job"]["output_dir"] == str(tmp_path)


def test_resuming_with_other_settings_says_which_and_keeps_the_values_it_ran_with(tmp_path, capsys):
    run = tmp_path / "run"
    job = JobSettings(output_dir=str(tmp_path), run_name="run")
    start_run_folder(run, StarPOConfig().training(lr=3e-4), job)
    resumed = JobSettings(**{**vars(job), "resume": True, "iterations": job.iterations + 5})  # extending is no change
    start_run_folder(run, StarPOConfig().training(lr=3e-4), resumed)
    assert "resume:" not in capsys.readouterr().out
    start_run_folder(run, StarPOConfig().training(lr=1e-4, num_groups=4), resumed)
    printed = capsys.readouterr().out
    assert "resume: the run continues with settings that differ" in printed
    assert "lr 0.0003 -> 0.0001; num_groups 8 -> 4." in printed
    recorded = json.loads((run / "run_config.json").read_text())
    assert recorded["config"]["lr"] == 1e-4 and len(recorded["resumed"]) == 2
    assert recorded["changed_on_resume"] == [{"at": recorded["resumed"][1],
                                              "fields": {"lr": [3e-4, 1e-4], "num_groups": [8, 4]}}]


def test_changed_settings_compares_values_as_they_are_stored():
    nan = float("nan")
    assert changed_settings({"a": nan, "b": {"x": 1, "y": 2}}, {"a": float("nan"), "b": {"y": 2, "x": 1}}) == {}
    assert changed_settings({"a": 1, "b": 2}, {"a": 1.5, "c": 3}) == {"a": [1, 1.5], "b": [2, None], "c": [None, 3]}


def _rows(path):
    with open(path / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_crashed_job_resumes_from_its_checkpoint_and_ends_as_if_never_stopped(ray_session, small_config, tmp_path,
                                                                                monkeypatch, capsys):
    config = small_config(validation_interval=3)
    job = JobSettings(iterations=3, checkpoint_interval=2, warm_start_steps=0, threads=1)
    whole = run_job(config, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "whole")}))

    training_step = StarPO.training_step

    def crash_in_the_third_iteration(self):
        if self.iteration == 2:
            raise RuntimeError("simulated crash")
        return training_step(self)

    monkeypatch.setattr(StarPO, "training_step", crash_in_the_third_iteration)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_job(config, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "crashed")}))
    crashed = (tmp_path / "crashed" / "latest").resolve()
    assert len(_rows(crashed)) == 2  # iterations 1 and 2 done, 2 checkpointed
    wall_before_crash = [float(r["job/wall_time_s"]) for r in _rows(crashed)]
    monkeypatch.setattr(StarPO, "training_step", training_step)
    # --resume with the job's folder continues the run its "latest" link points at.
    capsys.readouterr()
    resumed = run_job(config, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "crashed"), "resume": True}))
    assert resumed["run_dir"] == str(crashed)
    assert "resume:" not in capsys.readouterr().out  # the same settings: nothing to report

    # Same seeds, same weights, same optimizer state: the resumed run's numbers are the uninterrupted run's.
    columns = ["training_iteration", "env_runners/episode_return_mean", "learners/default_policy/actor/pg_loss",
               "learners/default_policy/actor/entropy"]
    assert [[r[c] for c in columns] for r in _rows(crashed)] == [[r[c] for c in columns]
                                                                 for r in _rows(pathlib.Path(whole["run_dir"]))]
    assert resumed["before"] == whole["before"] and resumed["after"] == whole["after"]
    assert resumed["validated_at"] == whole["validated_at"] == [0, 3]
    # The job's wall time runs on over the sessions: the resumed rows and summary add to the crashed session's.
    wall = [float(r["job/wall_time_s"]) for r in _rows(crashed)]
    assert wall[:2] == wall_before_crash and wall[0] < wall[1] < wall[2] < resumed["wall_time_s"]
    assert len(json.loads((crashed / "run_config.json").read_text())["resumed"]) == 1
    final = StarPO.from_checkpoint(crashed / "checkpoint")
    assert final.iteration == 3  # the last iteration is always checkpointed
    final.stop()
    # Resumed with fewer iterations than it has: it says so and keeps its iterations, rather than the number asked.
    capsys.readouterr()
    again = run_job(config, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "crashed"), "resume": True,
                                           "iterations": 2}))
    assert "the run is at iteration 3, and iterations is 2: nothing left to train" in capsys.readouterr().out
    assert again["iterations"] == 3 and again["after"] == whole["after"]




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
            lambda runner: (runner.weights_seq_no, runner.module.get_state()), local_env_runner=False)
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
        rates = {name: optimizer.param_groups[0]["lr"]
                 for name, optimizer in resumed.learner_group._learner._named_optimizers.items()}
    finally:
        resumed.stop()
    assert rates == {f"{DEFAULT_MODULE_ID}_actor": 5e-4, f"{DEFAULT_MODULE_ID}_critic": 2e-3}
