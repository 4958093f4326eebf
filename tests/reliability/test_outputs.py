"""Outputs that could not be written: the main job fails before any work, and an export never skips silently."""

import logging
import logging.handlers
import pathlib
import re

import pytest

from rllib_ragen import StarPOConfig
from rllib_ragen.jobs.run import JobSettings, run_job


def test_a_named_run_that_exists_is_refused_before_any_work(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "policy").write_text("an earlier run's file")
    # An invalid env would fail at build: reaching it would mean the folder was not claimed first.
    with pytest.raises(ValueError, match="run_name='run': .* holds an earlier run"):
        run_job(
            StarPOConfig().environment("Nope-v0"), JobSettings(output_dir=str(tmp_path), run_name="run", iterations=1)
        )
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["policy"]  # nothing else was written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # not even the "latest" link


def test_two_jobs_started_at_once_with_the_same_name_never_share_a_folder(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from rllib_ragen.jobs.run import claim_run_folder

    named = JobSettings(output_dir=str(tmp_path), run_name="same")
    with ThreadPoolExecutor(8) as pool:  # the check and the creation are one step (mkdir): exactly one wins
        outcomes = list(pool.map(lambda _: _claim(claim_run_folder, named), range(8)))
    assert outcomes.count("claimed") == 1 and outcomes.count("refused") == 7
    default = JobSettings(output_dir=str(tmp_path / "default"))
    with ThreadPoolExecutor(8) as pool:  # default names: each job gets a folder of its own
        folders = list(pool.map(lambda _: claim_run_folder(default, 0), range(8)))
    assert len(set(folders)) == 8 and all(folder.is_dir() for folder in folders)


def _claim(claim, job) -> str:
    try:
        claim(job, 0)
        return "claimed"
    except FileExistsError:
        return "refused"


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(ValueError, match="output_dir=.* is a file; choose another --output-dir"):
        run_job(StarPOConfig(), JobSettings(output_dir=str(tmp_path / "run")))
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "named").write_text("")
    with pytest.raises(ValueError, match="run_name='named': .* choose another --run-name"):
        run_job(StarPOConfig(), JobSettings(output_dir=str(tmp_path / "job"), run_name="named"))


def test_a_model_path_that_is_no_folder_exits_2_with_one_line_before_anything_is_created(tmp_path):
    import subprocess
    import sys

    # A new user's typo: it used to print the plan, then a 54-line traceback, and leave a run folder behind.
    job = pathlib.Path(__file__).resolve().parents[2] / "tuned_examples" / "starpo_bandit.py"
    done = subprocess.run(
        [sys.executable, str(job), "--model", "./models/my-qwen", "--output-dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "model='./models/my-qwen' is no local folder" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() and done.stdout == ""


@pytest.mark.slow
def test_export_onto_a_file_raises(ray_session, small_config, tmp_path):
    algo = small_config(validation_interval=0).build_algo()
    try:
        (tmp_path / "policy").write_text("")
        with pytest.raises(NotADirectoryError, match="it is a file"):
            algo.export_pretrained(tmp_path / "policy")
    finally:
        algo.stop()


@pytest.mark.parametrize(
    "field, value",
    [
        ("iterations", 0),
        ("threads", 1.5),
        ("warm_start_steps", -1),
        ("warm_start_lr", 0.0),
        ("pass_bar", float("nan")),
        ("iterations", True),
        ("run_name", "a/b"),
        ("run_name", "latest"),
        ("verbose", "no"),
        ("quick", "yes"),
        ("timed_command", "no_such_job.py"),
        ("threads", -1),
        ("max_failures", -1),
        ("max_failures", True),
        ("seeds", "0,x"),
        ("seeds", "1,1"),
        ("seeds", "-1"),
        ("grid", {"lr": []}),
        ("grid", {"lr": 1e-4}),
    ],
)
def test_bad_job_settings_fail_before_any_work_naming_the_field(tmp_path, field, value):
    job = JobSettings(output_dir=str(tmp_path / "run"), **{field: value})
    with pytest.raises(ValueError, match=re.escape(f"{field}={value!r}")):
        run_job(StarPOConfig(), job)
    assert not (tmp_path / "run").exists()  # nothing was written


def test_a_main_job_refuses_separate_policies_before_any_work(tmp_path):
    # Its report, evaluate and the self-play job's matches read back one policy folder.
    config = (
        StarPOConfig()
        .environment("rllib_ragen/TicTacToe-v0", env_config={"opponent": "random"})
        .training(self_play=True, max_actions_per_turn=1)
        .multi_agent(policies={"x", "o"}, policy_mapping_fn=lambda seat, episode, **kwargs: seat)
    )
    with pytest.raises(ValueError, match=re.escape("multi_agent(policies=['o', 'x']): a main job reads back one")):
        run_job(config, JobSettings(output_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "grid, message",
    [
        ({"no_such_knob": [1]}, "grid names ['no_such_knob']"),
        ({"lr": [1e-4, 0.0]}, "grid lr=0.0: "),
        # Named variants: each variant's settings are checked as its trial will build them.
        ({"variant": {"a": {"no_such_knob": 1}}}, "grid names ['no_such_knob']"),
        ({"variant": {"fine": {}, "bad": {"lr": 0.0}}}, "grid variant='bad': "),
        ({"variant": {"a": {"lr": 1e-4}}, "lr": [1e-3]}, "grid varies ['lr'] both as a list and in its variants"),
        ({"variant": {"a": {"seed": 1}}}, "grid varies 'seed'"),
        ({"variant": {"a": {}}, "preset": ["starpo"]}, "grid has both 'preset' and 'variant'"),
        ({"variant": ["a", "b"]}, "must map config fields to non-empty lists of values"),
    ],
)
def test_a_sweep_with_an_unknown_knob_or_a_bad_point_fails_before_any_work(tmp_path, grid, message):
    # Each point is validated as its trial would build it: a bad one must not fail mid-sweep, after other trials ran.
    with pytest.raises(ValueError, match=re.escape(message)):
        run_job(StarPOConfig(), JobSettings(output_dir=str(tmp_path / "run"), grid=grid))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "where, message",
    [("/proc/rllib_ragen_run", "no folder can be created in /proc"), ("FILE/outputs/run", "which is a file")],
)
def test_an_output_dir_that_cannot_be_created_is_one_line_and_exit_code_2(tmp_path, capsys, where, message):
    # Both were a 20-line traceback naming no flag, exit code 1, after the job had started.
    from rllib_ragen.jobs.run import parse_job_args

    if where.startswith("/proc") and not pathlib.Path("/proc").is_dir():
        pytest.skip("no /proc on this machine")
    (tmp_path / "FILE").write_text("")
    with pytest.raises(SystemExit) as exit_code:
        parse_job_args(StarPOConfig(), JobSettings(), ["--output-dir", where.replace("FILE", str(tmp_path / "FILE"))])
    err = capsys.readouterr().err
    assert exit_code.value.code == 2 and message in err and "--output-dir" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]  # the probe left nothing


def test_a_bad_job_flag_exits_with_code_2_naming_the_field(capsys):
    from rllib_ragen.jobs.run import parse_job_args

    with pytest.raises(SystemExit) as exit_code:
        parse_job_args(StarPOConfig(), JobSettings(), ["--warm-start-lr", "-0.001"])
    assert exit_code.value.code == 2 and "warm_start_lr=-0.001" in capsys.readouterr().err


@pytest.mark.parametrize("before_rl", [True, False])
def test_a_job_without_periodic_validation_still_measures_before_and_after_and_never_passes_one_for_the_other(
    before_rl, ray_session, small_config, tmp_path, capsys
):
    # validation_interval=0 turns off validation between iterations, not the job's before/after table. With
    # validate_before_training=False nothing is measured before RL: "before" is NaN and no gain is judged (it
    # used to be the after-RL validation, a gain of exactly 0 reported as measured).
    import json
    import math
    import pathlib

    config = small_config(validation_interval=0, validate_before_training=before_rl)
    summary = run_job(config, JobSettings(output_dir=str(tmp_path), iterations=1, warm_start_steps=0, threads=1))
    printed = capsys.readouterr().out
    assert summary["validated_at"] == ([0, 1] if before_rl else [1]) and summary["ended_by_time_budget"] is False
    assert math.isfinite(summary["after"]["success"])

    def no_nan(token):
        raise AssertionError(f"summary.json holds {token}: not standard JSON")

    written = json.loads((pathlib.Path(summary["run_dir"]) / "summary.json").read_text(), parse_constant=no_nan)
    # TensorBoard, over the whole output folder (which holds the "latest" link to the run folder), lists the one
    # trial once, with its metrics. Events in the run folder were listed twice: TensorBoard follows folder links.
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    board = EventMultiplexer().AddRunsFromDirectory(str(tmp_path))
    board.Reload()
    trial = pathlib.Path(summary["run_dir"])  # <output_dir>/<run>/<trial>
    run = f"tensorboard/{trial.parent.name}/{trial.name}"
    assert list(board.Runs()) == [run] and "ray/tune/time/sample_s" in board.Runs()[run]["scalars"]
    assert (tmp_path / "latest").is_symlink() and not list(tmp_path.glob("latest/**/events.out.tfevents.*"))
    assert written["validated_at"] == summary["validated_at"]
    # Where the trial ran, as the trial's own process saw it (one torch thread: threads=1), in its summary and table.
    import torch

    from rllib_ragen.jobs.callbacks import machine_record
    from rllib_ragen.jobs.report_tables import describe_machine

    (machine,) = json.loads((trial / "machine.json").read_text())
    assert machine == {**machine_record(), "torch_threads": 1} and written["machine"] == [machine]
    assert machine["packages"]["torch"] == torch.__version__ and machine["cpu_kernels"] in ("DEFAULT", "AVX2", "AVX512")
    assert f"{'machine':28s}{describe_machine(machine)}" in printed and torch.__version__ in describe_machine(machine)
    # The trial's settings read back whole from Tune's params.json, the job's sentinel rules included.
    from rllib_ragen.jobs.evaluate import evaluation_config

    assert [rule["name"] for rule in evaluation_config(trial).sentinel_rules] == [
        "reward std vanished",
        "entropy collapsed",
        "grad-norm spike",
        "reasoning collapsed",
    ]
    if before_rl:
        assert math.isfinite(summary["before"]["success"]) and summary["paired"]["n"] == 4
        assert summary["success_gain"] == summary["after"]["success"] - summary["before"]["success"]
        assert "before RL and after the last iteration" in printed
    else:
        assert all(math.isnan(value) for value in summary["before"].values())
        assert math.isnan(summary["success_gain"]) and summary["passed"] is False and summary["paired"] is None
        assert written["before"]["success"] is None and written["success_gain"] is None  # not measured: null
        assert "success gain not measured" in printed and "validation states after the last iteration" in printed


@pytest.mark.parametrize(
    "content, message",
    [
        (b"x", r"is not valid JSON \(JSONDecodeError"),
        (b"\x00" * 1000, "is not valid JSON"),
        (b"[" * 100_000, r"is not valid JSON \(RecursionError"),
    ],
)
def test_a_damaged_run_record_is_named_not_a_bare_decode_error(tmp_path, content, message):
    from rllib_ragen.jobs.outputs import RunFileError, read_run_json

    path = tmp_path / "machine.json"
    path.write_bytes(content)
    with pytest.raises(RunFileError, match=message) as error:
        read_run_json(path, [])
    assert str(path) in str(error.value)
    assert read_run_json(tmp_path / "absent.json", []) == []


def test_a_run_record_too_large_to_be_one_is_refused_unread(tmp_path, monkeypatch):
    from rllib_ragen.jobs import outputs

    path = tmp_path / "machine.json"
    with open(path, "wb") as f:  # 1 GB of NULs, sparse: the size is what is checked, before any byte is read
        f.truncate(1 << 30)
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda self: pytest.fail("read a file it should refuse"))
    with pytest.raises(outputs.RunFileError, match=r"is 1,073,741,824 bytes, more than a run's record can be"):
        outputs.read_run_json(path)


def test_library_notices_are_held_then_written_to_the_run_log_never_to_the_console(tmp_path, capfd):
    """A notice raised before the run folder exists waits in memory, then lands in job.log with the later ones;
    after the run, notices go back to waiting, never into that folder."""
    from rllib_ragen.jobs.console import close_run_log, keep_notices_off_the_console, send_notices_to

    keep_notices_off_the_console()
    logging.getLogger("ray.rllib.algorithms.algorithm_config").warning("early notice, before the run folder")
    send_notices_to(tmp_path / "job.log")
    logging.getLogger("transformers.modeling_utils").warning("notice during the run")
    close_run_log()
    logging.getLogger("transformers").warning("notice after the run")
    written = (tmp_path / "job.log").read_text()
    assert "early notice, before the run folder" in written and "notice during the run" in written
    assert "notice after the run" not in written
    printed = capfd.readouterr()
    assert "notice" not in printed.out + printed.err


def test_starpo_refuses_the_old_api_stack_and_keeps_rllibs_notice_offering_it_quiet():
    from ray.util.debug import reset_log_once

    handler = logging.handlers.MemoryHandler(capacity=100)
    rllib_config_logger = logging.getLogger("ray.rllib.algorithms.algorithm_config")
    rllib_config_logger.addHandler(handler)
    try:
        reset_log_once("StarPO_on_new_api_stack")
        StarPOConfig().validate()
        assert not [r for r in handler.buffer if "API stack" in r.getMessage()]
    finally:
        rllib_config_logger.removeHandler(handler)
    with pytest.raises(ValueError, match=re.escape("api_stack: StarPO runs on RLlib's new API stack alone")):
        StarPOConfig().api_stack(
            enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False
        ).validate()
