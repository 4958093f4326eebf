"""Outputs that could not be written: the main job fails before any work, and an export never skips silently."""

import pytest

from rllib_ragen import StarPOConfig
from rllib_ragen.experiment import JobSettings, run_job


@pytest.mark.parametrize("blocker", ["policy", "metrics.csv/"])
def test_a_job_whose_outputs_cannot_be_written_fails_before_any_work(tmp_path, blocker):
    out = tmp_path / "run"
    out.mkdir()
    if blocker.endswith("/"):
        (out / blocker.rstrip("/")).mkdir()  # a folder where a file goes
    else:
        (out / blocker).write_text("not a model")  # a file where the exported policy's folder goes
    # An invalid env would fail at build: reaching it would mean the outputs were not checked first.
    with pytest.raises(FileExistsError, match=blocker.rstrip("/")):
        run_job(StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path), run_name="run",
                                                                   iterations=1))
    assert sorted(p.name for p in out.iterdir()) == [blocker.rstrip("/")]  # nothing else was written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # not even the "latest" link


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(NotADirectoryError, match="--output-dir"):
        run_job(StarPOConfig(), JobSettings(output_dir=str(tmp_path / "run")))
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "named").write_text("")
    with pytest.raises(NotADirectoryError, match="--run-name"):
        run_job(StarPOConfig(), JobSettings(output_dir=str(tmp_path / "job"), run_name="named"))


@pytest.mark.slow
def test_export_onto_a_file_raises(ray_session, small_config, tmp_path):
    algo = small_config(validation_interval=0).build_algo()
    try:
        (tmp_path / "policy").write_text("")
        with pytest.raises(NotADirectoryError, match="it is a file"):
            algo.export_pretrained(tmp_path / "policy")
    finally:
        algo.stop()


@pytest.mark.parametrize("field, value", [("iterations", 0), ("threads", 1.5), ("warm_start_steps", -1),
                                          ("warm_start_lr", 0.0), ("pass_bar", float("nan")), ("iterations", True),
                                          ("run_name", "a/b"), ("run_name", "latest"), ("verbose", "no"),
                                          ("expected_minutes", -1.0)])
def test_bad_job_settings_fail_before_any_work_naming_the_field(tmp_path, field, value):
    job = JobSettings(output_dir=str(tmp_path / "run"), **{field: value})
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        run_job(StarPOConfig(), job)
    assert not (tmp_path / "run").exists()  # nothing was written


def test_a_bad_job_flag_exits_with_code_2_naming_the_field(capsys):
    from rllib_ragen.experiment import parse_job_args

    with pytest.raises(SystemExit) as exit_code:
        parse_job_args(StarPOConfig(), JobSettings(), ["--warm-start-lr", "-0.001"])
    assert exit_code.value.code == 2 and "warm_start_lr=-0.001" in capsys.readouterr().err


def test_a_resumed_run_drops_the_training_samples_it_will_play_again(tmp_path):
    import pyarrow.parquet as pq

    from rllib_ragen.experiment_outputs import keep_rollouts_up_to, write_rollouts
    from rllib_ragen.rollout.engine import Trajectory

    episode = Trajectory(env_name="e", group=0, seed=1, token_ids=[1, 2], response_mask=[0, 1],
                         behaviour_logprobs=[0.0, -0.5], turn_spans=[(1, 2)], turn_rewards=[1.0])
    path = tmp_path / "training_rollouts.parquet"
    for iteration in (1, 6, 11):  # samples kept at three probe iterations; the checkpoint was at iteration 10
        write_rollouts(path, [episode, episode], iteration=iteration, append=True)
    keep_rollouts_up_to(path, 10)
    assert [r["iteration"] for r in pq.read_table(path).to_pylist()] == [1, 1, 6, 6]
    keep_rollouts_up_to(tmp_path / "missing.parquet", 10)  # no sample yet: nothing to do


@pytest.mark.parametrize("before_rl", [True, False])
def test_a_job_without_periodic_validation_still_measures_before_and_after_and_never_passes_one_for_the_other(
        before_rl, ray_session, small_config, tmp_path, capsys):
    # validation_interval=0 turns off validation between iterations, not the job's before/after table. With
    # validate_before_training=False nothing is measured before RL: "before" is NaN and no gain is judged (it
    # used to be the after-RL validation, a gain of exactly 0 reported as measured).
    import json
    import math
    import pathlib

    config = small_config(validation_interval=0, validate_before_training=before_rl)
    summary = run_job(config, JobSettings(output_dir=str(tmp_path), iterations=1, warm_start_steps=0, threads=1))
    printed = capsys.readouterr().out
    assert summary["validated_at"] == ([0, 1] if before_rl else [1])
    assert math.isfinite(summary["after"]["success"])
    def no_nan(token):
        raise AssertionError(f"summary.json holds {token}: not standard JSON")

    written = json.loads((pathlib.Path(summary["run_dir"]) / "summary.json").read_text(), parse_constant=no_nan)
    assert written["validated_at"] == summary["validated_at"]
    if before_rl:
        assert math.isfinite(summary["before"]["success"]) and summary["paired"]["n"] == 4
        assert summary["success_gain"] == summary["after"]["success"] - summary["before"]["success"]
        assert "before RL and after the last iteration" in printed
    else:
        assert all(math.isnan(value) for value in summary["before"].values())
        assert math.isnan(summary["success_gain"]) and summary["passed"] is False and summary["paired"] is None
        assert written["before"]["success"] is None and written["success_gain"] is None  # not measured: null
        assert "success gain not measured" in printed and "held-out states after the last iteration" in printed
