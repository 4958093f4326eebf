"""The main jobs: their configs and demonstration policies, for benchmarks that measure on a job's own setting; and,
run as a script, their stated times measured (each job's own command in a fresh output folder, warm start
included), printed beside what the job states:

    python benchmarks/main_jobs.py [--jobs "starpo_bandit.py;starpo_frozenlake.py --seed 1"]
"""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def job_module(file_name: str):
    """``tuned_examples/<file_name>`` as a module: its ``config`` and ``job``; runs nothing (the job runs under
    ``__main__``)."""
    spec = importlib.util.spec_from_file_location(
        f"job_{pathlib.Path(file_name).stem}", ROOT / "tuned_examples" / file_name
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demonstration_policy(config):
    """The job's own demonstrations (its ``__main__`` block passes the same policy to ``run_job``)."""
    import gymnasium as gym

    from rllib_ragen import demonstrators

    if config.env.endswith("Bandit-v0"):
        return demonstrators.random_arm_policy(seed=config.seed, enable_thinking=config.enable_thinking)
    if "FrozenLake" in config.env:
        slippery = gym.make(config.env, **config.env_config).unwrapped.is_slippery
        return demonstrators.frozen_lake_optimal_policy(config.enable_thinking, is_slippery=slippery)
    return demonstrators.sokoban_solver_policy(config.max_actions_per_turn, config.enable_thinking)


# ---- the main jobs' stated times, measured -------------------------------------------------------------------------
TOLERANCE = 0.25  # a stated time holds within 25% (issue 68)


def time_job(command: str, output_dir: pathlib.Path) -> tuple[float, int]:
    """Wall seconds and exit code of a tuned example's command (``"<file> [flags]"``, run as ``python
    tuned_examples/<file> [flags]``) in a fresh output folder, so that its warm start is trained rather than taken
    from a cache."""
    import shlex
    import subprocess
    import sys
    import time

    file_name, *flags = shlex.split(command)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "tuned_examples" / file_name), "--output-dir", str(output_dir), *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode:
        print(f"{command} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", flush=True)
    return seconds, done.returncode


def main(argv: list[str] | None = None) -> int:
    """Time each tuned example's command of the job-time table (rllib_ragen.jobs.job_times) on this machine and
    print it beside the table's figure for this kind of CPU; run nothing else meanwhile. A new figure goes into
    that table, which the plan lines, the README and the docs quote."""
    import argparse
    import os
    import tempfile

    from rllib_ragen.hardware import cpu_computes_bfloat16
    from rllib_ragen.jobs.job_times import JOB_TIMES, job_time

    parser = argparse.ArgumentParser(description=main.__doc__.split(";")[0])
    parser.add_argument(
        "--jobs",
        default=";".join(JOB_TIMES),
        help="';'-separated commands of tuned_examples/ with their flags, e.g. 'starpo_bandit.py;"
        "starpo_frozenlake.py --warm-start-precision float32' (default: every command of the "
        "table)",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        default=None,
        help="keep the jobs' run folders in DIR/job<n> (default: a temporary folder, removed at the end)",
    )
    args = parser.parse_args(argv)
    native = cpu_computes_bfloat16()
    print(f"{os.cpu_count()} CPUs; native bfloat16 (AVX512-BF16 or AMX): {'yes' if native else 'no'}")
    print(f"{'command':60s} {'table':>8s} {'measured':>9s} {'ratio':>6s}  holds (within {TOLERANCE:.0%})")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="main_jobs_") as temporary:
        folder = args.keep or temporary
        for number, command in enumerate(c.strip() for c in args.jobs.split(";") if c.strip()):
            seconds, code = time_job(command, pathlib.Path(folder) / f"job{number}")
            failed += code != 0
            stated, _ = job_time(command, native)
            if stated is None:
                print(
                    f"{command:60s} {'':>8s} {seconds / 60:8.1f}m  (not in the table for this kind of CPU)", flush=True
                )
                continue
            ratio = seconds / 60 / stated.minutes
            print(
                f"{command:60s} {stated.minutes:7.1f}m {seconds / 60:8.1f}m {ratio:6.2f}  "
                f"{'yes' if abs(ratio - 1) <= TOLERANCE else 'NO'}",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
