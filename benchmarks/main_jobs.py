"""The main jobs: their configs and demonstration policies, for benchmarks that measure on a job's own setting; and,
run as a script, their stated times measured (each job's own command in a fresh output folder, warm start
included), printed beside what the job states:

    python benchmarks/main_jobs.py [--jobs "starpo_bandit.py;starpo_frozenlake.py --seed 1"] [--quick]
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def job_module(file_name: str):
    """``tuned_examples/<file_name>`` as a module: its ``config`` and ``job``; runs nothing (the job runs under
    ``__main__``)."""
    spec = importlib.util.spec_from_file_location(f"job_{pathlib.Path(file_name).stem}",
                                                  ROOT / "tuned_examples" / file_name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demonstration_policy(config):
    """The job's own demonstrations (its ``__main__`` block passes the same policy to ``run_job``)."""
    import gymnasium as gym

    from rllib_ragen.rollout import scripted

    if config.env.endswith("Bandit-v0"):
        return scripted.random_arm_policy(seed=config.seed, enable_thinking=config.enable_thinking)
    if "FrozenLake" in config.env:
        slippery = gym.make(config.env, **config.env_config).unwrapped.is_slippery
        return scripted.frozen_lake_optimal_policy(config.enable_thinking, is_slippery=slippery)
    return scripted.sokoban_solver_policy(config.max_actions_per_turn, config.enable_thinking)


# ---- the main jobs' stated times, measured -------------------------------------------------------------------------
# Every tuned example that states a time, as its docstring's command with no flags.
STATED_COMMANDS = ("starpo_bandit.py", "starpo_frozenlake.py", "starpo_sokoban.py", "starpo_gem.py", "starpo_tools.py",
                   "generalization.py", "tune_sokoban.py", "echo_trap.py", "filter_study.py", "estimator_study.py")
TOLERANCE = 0.25  # a stated time holds within 25% (issue 68)
PLAN_ESTIMATE = re.compile(r"this job takes about ([0-9.]+) min")


def time_job(command: str, output_dir: pathlib.Path) -> tuple[float, int, float | None]:
    """Wall seconds and exit code of a tuned example's command (``"<file> [flags]"``, run as ``python
    tuned_examples/<file> [flags]``) in a fresh output folder, so that its warm start is trained rather than taken
    from a cache; and the minutes the job itself states (its plan line, from ``JobSettings.expected_minutes``),
    None where it states none."""
    import shlex
    import subprocess
    import sys
    import time

    file_name, *flags = shlex.split(command)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "tuned_examples" / file_name), "--output-dir", str(output_dir),
                           *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        print(f"{command} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", flush=True)
    stated = PLAN_ESTIMATE.search(done.stdout)
    return seconds, done.returncode, float(stated.group(1)) if stated else None


def main(argv: list[str] | None = None) -> int:
    """Time each tuned example's stated command on this machine and print it beside the time the job states (its
    plan line: ``JobSettings.expected_minutes``, measured on a quiet 2-core CPU; run nothing else meanwhile)."""
    import argparse
    import os
    import tempfile

    import torch

    parser = argparse.ArgumentParser(description=main.__doc__.split(";")[0])
    parser.add_argument("--jobs", default=";".join(STATED_COMMANDS),
                        help="';'-separated commands of tuned_examples/ with their flags, e.g. 'starpo_bandit.py;"
                             "starpo_frozenlake.py --warm-start-precision float32' (default: every stated command)")
    parser.add_argument("--quick", action="store_true", help="also time each job with --quick")
    parser.add_argument("--keep", metavar="DIR", default=None,
                        help="keep the jobs' run folders in DIR/job<n> (default: a temporary folder, removed at the end)")
    args = parser.parse_args(argv)
    native_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    print(f"{os.cpu_count()} CPUs; native bfloat16 (AVX512-BF16 or AMX): {'yes' if native_bf16 else 'no'}")
    print(f"{'command':60s} {'stated':>8s} {'measured':>9s} {'ratio':>6s}  holds (within {TOLERANCE:.0%})")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="main_jobs_") as temporary:
        folder = args.keep or temporary
        for number, command in enumerate(c.strip() for c in args.jobs.split(";") if c.strip()):
            for extra in (["", " --quick"] if args.quick else [""]):
                seconds, code, stated = time_job(command + extra, pathlib.Path(folder) / f"job{number}{extra.strip()}")
                failed += code != 0
                label = command + extra
                if not stated:
                    print(f"{label:60s} {'':>8s} {seconds / 60:8.1f}m", flush=True)
                    continue
                ratio = seconds / 60 / stated
                print(f"{label:60s} {stated:7.1f}m {seconds / 60:8.1f}m {ratio:6.2f}  "
                      f"{'yes' if abs(ratio - 1) <= TOLERANCE else 'NO'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
