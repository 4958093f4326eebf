"""The main jobs through their real entry points (subprocess), with tiny budgets: they run, and what they write
parses. Whether they learn is measured by the full runs reported in the README, not here."""

import csv
import importlib.util
import json
import pathlib
import runpy
import subprocess
import sys

import pytest

from rllib_ragen.experiment import ExperimentArgs, parse_args

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY_BUDGET = ["--iterations", "2", "--num-groups", "2", "--group-size", "4", "--validation-size", "8",
               "--warm-start-episodes", "16", "--warm-start-steps", "5", "--max-new-tokens-per-turn", "24", "--max-turns", "2"]


def run_example(name: str, *flags: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tuned_examples" / name), *flags], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("example", ["starpo_bandit.py", "starpo_sokoban.py", "starpo_frozenlake.py"])
def test_example_runs_and_writes_its_outputs(example, tmp_path):
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM

    done = run_example(example, *TINY_BUDGET, "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "iter   2/2 | success" in done.stdout  # progress while it runs
    assert "before" in done.stdout and "after" in done.stdout and "wall time" in done.stdout  # the final table
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["validated_at"] == [0, 2] and summary["validation_episodes"] == 8
    assert 0.0 <= summary["before"]["success"] <= 1.0 and 0.0 <= summary["after"]["success"] <= 1.0
    bar = runpy.run_path(str(ROOT / "tuned_examples" / example), run_name="imported")["PASS_BAR"]
    assert summary["passed"] == (summary["success_gain"] >= bar)  # the job's pass bar, applied and recorded
    assert "(bar " in done.stdout
    lines = (tmp_path / "metrics.csv").read_text().strip().splitlines()
    assert len(lines) == 3 and "learner/actor/entropy" in lines[0]  # header + one row per iteration
    rollouts = pq.read_table(tmp_path / "validation_rollouts.parquet").to_pylist()
    assert len(rollouts) == 8 and all(r["text"] and r["num_turns"] >= 1 for r in rollouts)
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    AutoModelForCausalLM.from_pretrained(tmp_path / "warm_start")


def test_flags_override_the_examples_defaults():
    defaults = ExperimentArgs(env="rllib_ragen/Bandit-v0", iterations=10, lr=5e-4)
    args = parse_args(defaults, ["--iterations", "3", "--preset", "starpo", "--no-enable-thinking"])
    assert (args.iterations, args.preset, args.enable_thinking, args.lr) == (3, "starpo", False, 5e-4)
    args = parse_args(defaults, ["--env-config", '{"reward": "success"}'])
    assert args.env_config == {"reward": "success"} and defaults.env_config == {}


def test_gpu_machines_get_the_reference_settings_and_the_jobs_own(monkeypatch):
    import torch

    frozenlake = runpy.run_path(str(ROOT / "tuned_examples" / "starpo_frozenlake.py"), run_name="imported")
    defaults, gpu_defaults = frozenlake["DEFAULTS"], frozenlake["GPU_DEFAULTS"]
    assert parse_args(defaults, [], gpu_defaults).env == "rllib_ragen/FrozenLakeNotSlippery-v0"  # this CPU machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = parse_args(defaults, [], gpu_defaults)
    assert (args.model, args.num_groups, args.group_size) == ("Qwen/Qwen2.5-0.5B-Instruct", 8, 16)
    assert (args.env, args.enable_thinking) == ("rllib_ragen/FrozenLake-v0", True)  # the reference's lake
    assert parse_args(defaults, ["--env", "rllib_ragen/FrozenLakeNotSlippery-v0"], gpu_defaults).env.endswith(
        "NotSlippery-v0")  # flags still win


@pytest.mark.parametrize("bad", ["{reward: success}", '["success"]'])
def test_env_config_that_is_not_a_json_object_is_refused(bad, capsys):
    with pytest.raises(SystemExit):
        parse_args(ExperimentArgs(), ["--env-config", bad])
    assert "--env-config" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the message shown without vLLM")
def test_vllm_backend_without_vllm_is_refused_with_the_install_command():
    done = run_example("starpo_bandit.py", "--backend", "vllm")
    assert done.returncode == 2 and "pip install 'rllib_ragen[vllm]'" in done.stderr


def test_tune_sweep_runs_its_grid_and_reports_the_best_trial(tmp_path):
    script = ROOT / "tuned_examples" / "tune_sokoban.py"
    done = subprocess.run([sys.executable, str(script), "--actions-per-turn", "1,5", "--updates", "1",
                           "--keep-ratios", "1.0", "--iterations", "1", "--validation-size", "4",
                           "--warm-start-steps", "3", "--warm-start-episodes", "8", "--output-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "trials.csv") as f:
        trials = list(csv.DictReader(f))
    assert sorted(int(t["max_actions_per_turn"]) for t in trials) == [1, 5]  # one trial per grid point
    assert all(not t["error"] and 0.0 <= float(t["success_after"]) <= 1.0 for t in trials)
    assert "best: {'max_actions_per_turn'" in done.stdout
    assert (tmp_path / "comparison.png").read_bytes()[:4] == b"\x89PNG"
