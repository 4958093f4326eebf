"""Main jobs checkpoint as they go and ``--resume`` continues a crashed run exactly where its checkpoint left it."""

import csv

import pytest

from rllib_ragen import StarPO, StarPOConfig
from rllib_ragen.experiment import JobSettings, run_job


def test_resume_without_a_checkpoint_fails_before_any_work(tmp_path):
    with pytest.raises(FileNotFoundError, match="--resume: there is no checkpoint at"):
        run_job(StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path / "run"), resume=True))
    assert not (tmp_path / "run").exists()


def test_a_fresh_run_never_overwrites_an_earlier_runs_checkpoint(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "rllib_checkpoint.json").write_text("{}")
    with pytest.raises(FileExistsError, match="Continue it with --resume"):
        run_job(StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path)))
    assert (tmp_path / "checkpoint" / "rllib_checkpoint.json").read_text() == "{}"


def _rows(path):
    with open(path / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_crashed_job_resumes_from_its_checkpoint_and_ends_as_if_never_stopped(ray_session, small_config, tmp_path,
                                                                                monkeypatch):
    config = small_config(validation_interval=3)
    job = JobSettings(iterations=3, checkpoint_interval=2, warm_start_steps=0, threads=1)
    whole = run_job(config, JobSettings(**{**vars(job), "output_dir": str(tmp_path / "whole")}))

    crashed = tmp_path / "crashed"
    training_step = StarPO.training_step

    def crash_in_the_third_iteration(self):
        if self.iteration == 2:
            raise RuntimeError("simulated crash")
        return training_step(self)

    monkeypatch.setattr(StarPO, "training_step", crash_in_the_third_iteration)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_job(config, JobSettings(**{**vars(job), "output_dir": str(crashed)}))
    assert len(_rows(crashed)) == 2  # iterations 1 and 2 done, 2 checkpointed
    monkeypatch.setattr(StarPO, "training_step", training_step)
    resumed = run_job(config, JobSettings(**{**vars(job), "output_dir": str(crashed), "resume": True}))

    # Same seeds, same weights, same optimizer state: the resumed run's numbers are the uninterrupted run's.
    columns = ["training_iteration", "env_runners/episode_return_mean", "learners/default_policy/actor/pg_loss",
               "learners/default_policy/actor/entropy", "evaluation/env_runners/rollout/success"]
    assert [[r[c] for c in columns] for r in _rows(crashed)] == [[r[c] for c in columns] for r in _rows(tmp_path / "whole")]
    assert resumed["before"] == whole["before"] and resumed["after"] == whole["after"]
    assert resumed["validated_at"] == whole["validated_at"] == [0, 3]
    final = StarPO.from_checkpoint(crashed / "checkpoint")
    assert final.iteration == 3  # the last iteration is always checkpointed
    final.stop()
