"""The main jobs' time-left estimate: iterations only, the warm-up iteration and one-off costs left out."""

import io

import pytest

from rllib_ragen.jobs.console import _Clock


def test_time_left_counts_typical_iterations_and_the_validations_still_due():
    clock = _Clock(iterations=10, validation_interval=2)
    # Iteration 1: 40 s, of which 10 s were the "before RL" validation (StarPO's time/validate_s).
    clock.record(40.0, validated=False, validation_seconds=10.0, validations=1)
    # Only iteration 1 seen: 9 iterations of its own 30 s, plus validations at 2, 4, 6, 8 and 10.
    assert clock.seconds_left(1) == pytest.approx(9 * 30 + 5 * 10)
    assert clock.last_s == 40.0  # the line's s/it is the whole iteration
    clock.record(20.0, validated=True, validation_seconds=12.0, validations=1)  # a validation now takes 12 s
    clock.record(8.0, validated=False, validation_seconds=0.0, validations=0)
    # Iterations 4-10 at the median own 8 s (iteration 1's warm-up left out), validations at 4, 6, 8 and 10.
    assert clock.seconds_left(3) == pytest.approx(7 * 8 + 4 * 12)


def test_an_iteration_with_the_before_validation_and_a_scheduled_one_splits_their_time():
    clock = _Clock(iterations=4, validation_interval=1)
    clock.record(50.0, validated=True, validation_seconds=30.0, validations=2)  # before RL, and after iteration 1
    assert clock.validation_s == 15.0 and clock.seconds_left(1) == pytest.approx(3 * 20 + 3 * 15)


def test_a_resumed_run_infers_the_validation_cost_and_counts_the_closing_validation():
    clock = _Clock(iterations=25, validation_interval=10)
    for seconds, validated in [(20.0, False), (8.0, False), (9.0, False), (7.0, False), (15.0, True)]:
        clock.record(seconds, validated)
    # No timed validation: it costs what a validating iteration takes beyond a typical one (15 - 8). Left after
    # iteration 5: 20 iterations, validations at 10 and 20, and the closing one after 25.
    assert clock.seconds_left(5) == pytest.approx(20 * 8 + 3 * 7)


# ---- the time budget (--max-minutes) ------------------------------------------------------------------------------
def test_the_time_budget_ends_a_trial_when_one_more_iteration_and_the_ending_would_not_fit():
    from rllib_ragen.jobs.callbacks import out_of_time

    # Iteration 1: 40 s, 10 of them the "before RL" validation (with its greedy play): its own time is 30 s.
    first = {"time_this_iter_s": 40.0, "time_total_s": 40.0, "time/validate_s": 10.0}
    # 40 spent + 30 for the next iteration + 10 to end = 80 s.
    assert not out_of_time(first, budget_s=80.0, ending_s=10.0)
    assert out_of_time(first, budget_s=79.9, ending_s=10.0)
    # A later iteration without validation: 100 s spent, 25 s its own; the ending measured earlier, 10 s.
    later = {"time_this_iter_s": 25.0, "time_total_s": 100.0}
    assert not out_of_time(later, budget_s=135.0, ending_s=10.0) and out_of_time(later, budget_s=134.9, ending_s=10.0)
    # Nothing validated in this session yet (a resumed trial): the iteration's own time stands in for the ending.
    assert out_of_time(later, budget_s=149.9, ending_s=0.0) and not out_of_time(later, budget_s=150.0, ending_s=0.0)


def test_a_job_with_a_time_budget_ends_early_validated_exported_and_says_so(
    ray_session, small_config, tmp_path, capsys
):
    import json
    import pathlib

    import pandas as pd

    from rllib_ragen.jobs.run import JobSettings, run_job

    # A budget no iteration fits (0.6 ms): the trial ends after its first iteration, not its fifth, the way a last
    # iteration ends: validated (not a scheduled validation: interval 4), played greedily, its policy exported.
    job = JobSettings(
        output_dir=str(tmp_path), run_name="budget", iterations=5, max_minutes=1e-5, warm_start_steps=0, threads=1
    )
    summary = run_job(small_config(validation_interval=4), job)
    printed = capsys.readouterr().out
    trial = pathlib.Path(summary["run_dir"])
    assert summary["iterations"] == 1 and summary["ended_by_time_budget"] is True
    assert summary["validated_at"] == [0, 1] and summary["paired_greedy"] is not None
    assert (trial / "policy" / "config.json").is_file()
    assert json.loads((trial / "summary.json").read_text())["ended_by_time_budget"] is True
    progress = pd.read_csv(trial / "progress.csv")
    assert progress["job/time_budget_stop"].tolist() == [1.0]
    assert "(or fewer: each trial ends within 1e-05 min of training)" in printed
    assert "time budget: the trial ends after iteration 1" in printed
    assert "the trial's time budget (max_minutes) ended it after iteration 1" in printed
    assert "validation at iteration 1" in printed and "interrupted" not in printed
    # The trial's phase file: what it did last (its console shows it in a quiet stretch).
    assert json.loads((trial / "phase.json").read_text()) | {"since": 0} == {
        "phase": "exporting the trained policy",
        "iteration": 1,
        "ending": True,
        "since": 0,
    }


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_progress_is_a_plain_line_every_few_seconds_and_one_at_the_end(monkeypatch):
    from rllib_ragen import progress as progress_module

    now = [100.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    stream = io.StringIO()
    with progress_module.Progress(10, "warm start", "steps", stream=stream, every_s=15.0) as shown:
        for step, seconds in enumerate([5, 5, 6, 5, 14], start=1):  # lines after 16 s and after 30 s
            now[0] += seconds
            shown.update(step, loss=0.25)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "warm start: 3/10 steps [00:16<00:37,  5.33s/step, loss 0.25]",
        "warm start: 5/10 steps [00:35<00:35,  7.00s/step, loss 0.25]",
    ]
    assert "\r" not in stream.getvalue()


def test_off_a_terminal_slow_steps_get_a_line_before_the_silence_would_pass_15_s(monkeypatch):
    """SmolLM2's warm-start steps take about 11 s on 2 cores: waiting for 10 s of silence and then one more step
    would leave 22 s without a line, so each such step gets its line."""
    from rllib_ragen import progress as progress_module

    now = [0.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    stream = io.StringIO()
    with progress_module.Progress(4, "warm start", "steps", stream=stream) as shown:
        for step in range(1, 5):
            now[0] += 11.0
            shown.update(step)
    assert [line.split(" [")[0] for line in stream.getvalue().splitlines()] == [
        "warm start: 1/4 steps",
        "warm start: 2/4 steps",
        "warm start: 3/4 steps",
        "warm start: 4/4 steps",
    ]


def test_on_a_terminal_progress_is_a_tqdm_bar():
    from rllib_ragen.progress import Progress

    stream = _Terminal()
    with Progress(4, "validation", "episodes", stream=stream) as shown:
        shown.update(4)
    assert "\r" in stream.getvalue() and "validation: 100%" in stream.getvalue() and "4/4" in stream.getvalue()


def test_the_engine_reports_the_episodes_ended_after_every_turn():
    from rllib_ragen.rollout.models import load_policy
    from rllib_ragen.demonstrators import frozen_lake_optimal_policy
    from rllib_ragen.warm_start import collect_demonstrations
    from rllib_ragen.rollout import RolloutConfig

    _, tokenizer = load_policy("tiny")
    calls = []
    demos = collect_demonstrations(
        RolloutConfig(env="rllib_ragen/FrozenLakeNotSlippery-v0", max_turns=5),
        frozen_lake_optimal_policy(False, is_slippery=False),
        tokenizer,
        6,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert len(demos) == 6 and calls[-1] == (6, 6) and len(calls) == max(len(t.turn_spans) for t in demos)
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:])) and {total for _, total in calls} == {6}


def test_the_console_prints_the_before_rl_score_once_the_trial_has_written_it(tmp_path, capsys, monkeypatch):
    import types

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rllib_ragen.jobs import console as console_module
    from rllib_ragen.jobs.outputs import BEFORE_GREEDY_ROLLOUTS, BEFORE_ROLLOUTS

    monkeypatch.setattr(console_module, "EARLY_LOOK_S", 0.0)
    console = console_module.JobConsole(
        iterations=5, validation_interval=0, env="rllib_ragen/Bandit-v0", headline="rllib_ragen/Bandit-v0", trials=1
    )
    trial = types.SimpleNamespace(
        trial_id="t0", path=str(tmp_path), storage=types.SimpleNamespace(trial_dir_name="seed0")
    )
    console.on_step_end(iteration=1, trials=[trial])
    assert capsys.readouterr().out == ""  # nothing written yet
    # Three states of the headline environment (one succeeded) and one of another validation environment.
    table = pa.table(
        {
            "env": ["rllib_ragen/Bandit-v0"] * 3 + ["rllib_ragen/BanditReversed-v0"],
            "seed": [1, 2, 3, 1],
            "success": [True, False, False, True],
        }
    )
    pq.write_table(table, tmp_path / BEFORE_ROLLOUTS)
    console.on_step_end(iteration=2, trials=[trial])
    console.on_step_end(iteration=3, trials=[trial])  # printed once
    pq.write_table(table, tmp_path / BEFORE_GREEDY_ROLLOUTS)
    console.on_step_end(iteration=4, trials=[trial])
    assert capsys.readouterr().out.splitlines() == [
        "before RL: validation success 0.333 sampled on 3 validation states of rllib_ragen/Bandit-v0",
        "before RL: validation success 0.333 greedy on 3 validation states of rllib_ragen/Bandit-v0",
    ]


def test_the_last_result_carries_the_peak_rss_read_after_the_closing_validation_and_export(monkeypatch, tmp_path):
    """Seed 2's SmolLM2 trial peaked at 8.1 GiB in its closing work, after its last row had read 6.1."""
    import types

    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, EVALUATION_RESULTS

    from rllib_ragen import metrics as M
    from rllib_ragen.jobs import callbacks

    order = []
    monkeypatch.setattr(callbacks, "write_rollouts", lambda *args, **kwargs: order.append("greedy play"))
    monkeypatch.setattr(callbacks, "peak_rss_gib", lambda: order.append("peak read") or 8.1)
    algorithm = types.SimpleNamespace(
        iteration=3,
        tokenizer=None,
        on_phase=None,
        play_validation_states=lambda temperature: [],
        announce_phase=lambda phase: None,
        export_pretrained=lambda path: order.append("export"),
        export_league=lambda path: order.append("league"),
    )
    result = {EVALUATION_RESULTS: {ENV_RUNNER_RESULTS: {M.VALIDATION_ITERATION: 3}}, M.PEAK_RSS: 6.1}
    callbacks.JobOutputs(iterations=3)._finish(algorithm, tmp_path, result)
    assert order == ["greedy play", "export", "league", "peak read"] and result[M.PEAK_RSS] == 8.1


def test_after_a_quiet_stretch_the_console_says_what_each_running_trial_is_doing(tmp_path, capsys, monkeypatch):
    """A SmolLM2 iteration on 2 cores takes 30-50 s: the console fills such a stretch with the trial's phase, read
    from the phase.json the trial writes as each phase starts."""
    import types

    from rllib_ragen.jobs import console as console_module
    from rllib_ragen.jobs.callbacks import PhaseFile
    from rllib_ragen.jobs.outputs import PHASE_FILE

    monkeypatch.setattr(console_module, "EARLY_LOOK_S", 0.0)
    console = console_module.JobConsole(
        iterations=5, validation_interval=0, env="rllib_ragen/Bandit-v0", headline="rllib_ragen/Bandit-v0", trials=1
    )
    trial = types.SimpleNamespace(
        trial_id="t0", path=str(tmp_path), status="RUNNING", storage=types.SimpleNamespace(trial_dir_name="seed0")
    )
    console.on_step_end(iteration=1, trials=[trial])
    assert capsys.readouterr().out == ""  # a line was printed less than QUIET_S ago (the console's start)
    console.last_line -= console_module.QUIET_S
    console.on_step_end(iteration=1, trials=[trial])
    assert capsys.readouterr().out.splitlines() == [
        "  starting the trial: Ray places it, then it builds the algorithm and loads the model"
    ]
    PhaseFile(types.SimpleNamespace(iteration=3), tmp_path / PHASE_FILE)("updating")  # the trial's side
    console.last_line -= console_module.QUIET_S
    console.on_step_end(iteration=2, trials=[trial])
    assert capsys.readouterr().out.splitlines() == ["  iteration 4: updating (0 s so far)"]
    console.on_step_end(iteration=3, trials=[trial])
    assert capsys.readouterr().out == ""  # that line starts a new quiet stretch
    ending = PhaseFile(types.SimpleNamespace(iteration=5), tmp_path / PHASE_FILE)
    ending.ending = True
    ending("exporting the trained policy")
    console.last_line -= console_module.QUIET_S
    console.on_step_end(iteration=4, trials=[trial])
    assert capsys.readouterr().out.splitlines() == ["  after iteration 5: exporting the trained policy (0 s so far)"]
    console.last_line -= console_module.QUIET_S
    trial.status = "TERMINATED"
    console.on_step_end(iteration=4, trials=[trial])
    assert capsys.readouterr().out == ""  # only running trials


def test_a_starpo_iteration_announces_each_phase_as_it_starts(ray_session, small_config):
    config = small_config("rllib_ragen/Bandit-v0", validation_size=2, validation_interval=1, num_groups=2, max_turns=1)
    algo = config.build_algo()
    phases = []
    algo.on_phase = phases.append
    try:
        algo.train()
        algo.play_validation_states(0.0)
    finally:
        algo.stop()
    assert phases == [
        "validating before RL",
        "sampling",
        "updating",
        "sending the weights to the runners",
        "validating",
        "playing the validation states greedily",
    ]


def test_a_phase_file_that_cannot_be_written_is_said_once_and_stops_nothing(tmp_path, caplog):
    import logging
    import types

    from rllib_ragen.jobs.callbacks import PhaseFile

    phases = PhaseFile(types.SimpleNamespace(iteration=0), tmp_path / "no_such_folder" / "phase.json")
    with caplog.at_level(logging.WARNING, logger="rllib_ragen.jobs.callbacks"):
        phases("sampling")
        phases("updating")
    warnings = [r.getMessage() for r in caplog.records if "phase file" in r.getMessage()]
    assert len(warnings) == 1 and "no_such_folder" in warnings[0]
