"""Ctrl-C or SIGTERM in the middle of a main job: Tune ends fit() early and returned as if the run had finished, so
the job printed a finished run's table (its "after" the warm start's validation) and exited 0 (SIGTERM: Ray's C++
stack trace, exit -6). Now it says the run was interrupted, exits non-zero, and prints the command that continues
it. A cut Tune state is refused at --resume, naming the file."""

import signal
import subprocess
import sys
import time

import pytest

from tests.test_tuned_examples import CPU_ONLY, ROOT

FLAGS = [
    "--iterations",
    "6",
    "--warm-start-steps",
    "3",
    "--warm-start-episodes",
    "8",
    "--validation-size",
    "8",
    "--validation-interval",
    "0",
    "--checkpoint-interval",
    "1",
    "--run-name",
    "cut",
]


@pytest.mark.slow
def test_an_interrupted_job_says_so_exits_non_zero_and_resumes(tmp_path):
    """SIGTERM (a scheduler's stop, kill) used to end in Ray's C++ stack trace and exit -6. The job now turns it into
    Ctrl-C's SIGINT, so this one run goes through both: the job's SIGTERM handler, then Tune's own interrupt."""
    command = [sys.executable, str(ROOT / "tuned_examples" / "starpo_bandit.py"), *FLAGS, "--output-dir", str(tmp_path)]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=CPU_ONLY)
    lines, deadline = [], time.monotonic() + 400
    for line in job.stdout:  # the first iteration's progress line, then Ctrl-C
        lines.append(line)
        if "iter   2/6" in line or time.monotonic() > deadline:
            job.send_signal(signal.SIGTERM)
            break
    out, err = job.communicate(timeout=300)
    stdout = "".join(lines) + out
    assert job.returncode != 0, stdout[-2000:]
    assert "the run was interrupted before its 6 iterations" in err, err[-3000:]
    assert "--resume" in err and "--run-name cut" in err
    assert "below the bar" not in stdout and "above the bar" not in stdout  # no final table of an unfinished run
    assert "SIGTERM received" not in err and job.returncode > 0  # no C++ stack dump, no death by a signal
    # What the printed command continues is a Tune state that restores (tests/reliability/test_resume.py runs a
    # resume to its end; a run is not played again here, for CI's time).
    from ray import tune

    from rllib_ragen.jobs.settings import _experiment_state_errors

    run = tmp_path / "cut"
    assert tune.Tuner.can_restore(str(run)) and _experiment_state_errors(run) == []
    assert f"--output-dir {tmp_path} --run-name cut" in err


def _state_folder(tmp_path, tuner_bytes: bytes, state_text: str | None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "tuner.pkl").write_bytes(tuner_bytes)
    if state_text is not None:
        (run / "experiment_state-2026-11-27_21-00-00.json").write_text(state_text)
    return run


@pytest.mark.parametrize(
    "tuner_bytes, state_text, message",
    [
        (b"", '{"trial_data": [["{}", "{}"]]}', r"tuner.pkl is missing or empty"),
        (b"\x80\x05...", '{"trial_data": [["{}", "{}"]', r"experiment_state-2026-11-27_21-00-00.json cannot be read"),
        (b"\x80\x05...", '{"trial_data": []}', r"lists no trial: Tune would start a trial from empty settings"),
        (b"\x80\x05...", None, r"has no experiment_state-\*.json"),
    ],
)
def test_resume_refuses_a_damaged_experiment_state_naming_the_file(tmp_path, tuner_bytes, state_text, message):
    from rllib_ragen.jobs.settings import _experiment_state_errors

    errors = _experiment_state_errors(_state_folder(tmp_path, tuner_bytes, state_text))
    assert errors and any(__import__("re").search(message, e) for e in errors), errors


def test_a_cut_tuner_pickle_is_named_instead_of_failing_inside_tune(tmp_path):
    import pickle

    from rllib_ragen.jobs.run import restore_tuner

    whole = pickle.dumps({"a": list(range(1000))})
    run = _state_folder(tmp_path, whole[:40], '{"trial_data": [["{}", "{}"]]}')
    with pytest.raises(ValueError, match=r"--resume: Tune could not read the run's state in .*tuner.pkl"):
        restore_tuner(run)


@pytest.mark.slow
def test_a_sigterm_after_the_last_iteration_is_said_and_exits_143(tmp_path):
    """A SIGTERM that lands once the trial has closed (its policy exported) while Tune winds down, or during the
    report, was ignored: exit 0 and a normal table, with no word of it (or, after fit(), Ray's C++ abort). The run
    is whole then: the job reports it, says the signal came, and exits 143, as a job stopped by SIGTERM does."""
    command = [
        sys.executable,
        str(ROOT / "tuned_examples" / "starpo_bandit.py"),
        "--iterations",
        "1",
        "--warm-start-steps",
        "3",
        "--warm-start-episodes",
        "8",
        "--validation-size",
        "8",
        "--validation-interval",
        "0",
        "--run-name",
        "closing",
        "--output-dir",
        str(tmp_path),
    ]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=CPU_ONLY)
    deadline = time.monotonic() + 600
    while not list((tmp_path / "closing").glob("*/policy/model.safetensors")) and time.monotonic() < deadline:
        time.sleep(0.02)
    job.send_signal(signal.SIGTERM)
    out, err = job.communicate(timeout=600)
    assert job.returncode == 143, (out[-2000:], err[-2000:])
    assert "SIGTERM arrived after the trials had finished their iterations" in err and "the run above is whole" in err
    assert "bar" in out  # the final table was printed
