"""The echo trap, watched: vanilla StarPO and StarPO-S from one warm start, side by side, diagnostics against
validation success, and the sentinel's firings.

A main job (``--job``: the bandit's by default, or ``starpo_sokoban``) with two trials of one Tune experiment, ``--grid
'{"preset": ["starpo", "starpo-s"]}'``, from one shared warm start, validated and probed for collapse
(``collapse_diagnostics_interval``, ``gradient_analysis_interval``) every iteration, the sentinel watching (``--sentinel
warn``; ``rollback`` or ``stop`` let it act). A trial "collapses" at the first validation from which its success stays
``--fall`` below its best so far to the end of the run; the sentinel's lead time is that iteration minus its first
firing's. When the trials end, the run folder gets ``echo_trap.png`` (a column per trial: validation success, in-group
reward std, entropy, grad norm, MI estimate, repeat rate; sentinel firings as red lines, the collapse as a black dashed
one) and ``echo_trap.md`` (the table), beside each trial's usual outputs. Every flag of the job works. The default
learning rate is ten times the bandit job's: the point is to see a collapse, and what comes first.

Command:  python tuned_examples/echo_trap.py [--job starpo_sokoban] [--iterations 20] [--lr 5e-3] [--fall 0.1]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py);
          --job starpo_sokoban runs for hours on 2 cores (80 iterations, each validated and probed): give it a GPU
Expect:   the figure and table of the two trials; docs/results/echo-trap.md
"""

import argparse
import dataclasses
import json
import math
import pathlib
import runpy

from rllib_ragen import metrics as M
from rllib_ragen.jobs.run import run_job
from rllib_ragen.jobs.outputs import LEARNER, VALIDATED_AT, VALIDATION, write_text_atomically
from rllib_ragen.jobs.readers import read_results
from rllib_ragen.jobs.curves import validations_of
from rllib_ragen.jobs.readers import trial_folders

SIGNALS = {
    "in-group reward std": M.FILTER_REWARD_STD,
    "entropy": LEARNER + M.ENTROPY,
    "actor grad norm": LEARNER + M.GRAD_NORM.format(optimizer="actor"),
    "MI estimate (nats)": M.MI_ESTIMATE,
    "repeat rate": M.REPEAT_RATE,
}


def study(job_name: str):
    """The main job's namespace, and its config and settings made into the study."""
    main_job = runpy.run_path(str(pathlib.Path(__file__).with_name(f"{job_name}.py")), run_name="imported")
    config = main_job["config"].copy(copy_frozen=False)
    config.environment(validation_envs=None).training(  # validate on the training environment alone
        lr=5e-3, validation_interval=1, collapse_diagnostics_interval=1, gradient_analysis_interval=1
    )
    job = dataclasses.replace(
        main_job["job"],
        output_dir=f"outputs/echo_trap/{job_name}",
        grid={"preset": ["starpo", "starpo-s"]},
        pass_bar=0.0,
        timed_command=f"echo_trap.py --job {job_name}".replace(" --job starpo_bandit", ""),
    )
    return main_job, config, job


def validation_fall(points: list[tuple[int, float]], drop: float) -> int | None:
    """The iteration a collapse began: the first from which validation success stays ``drop`` or more below the
    best it reached before, to the end of the run (a dip it recovers from is not a collapse). None: no collapse."""
    for index in range(1, len(points)):
        best_before = max(value for _, value in points[:index])
        if all(value <= best_before - drop for _, value in points[index:]):
            return points[index][0]
    return None


def write_echo_trap(run_dir: pathlib.Path, drop: float) -> str:
    """``echo_trap.png`` and ``echo_trap.md`` in ``run_dir``, from its finished trials; returns the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = trial_folders(run_dir)
    fig, axes = plt.subplots(
        1 + len(SIGNALS), len(trials), figsize=(5 * len(trials), 2.0 * (1 + len(SIGNALS))), sharex=True, squeeze=False
    )
    lines = [
        "| trial | validation: first / best / last | collapse from | first firing (rule) | lead (iterations) |",
        "|---|---|---|---|---|",
    ]
    for column, trial in enumerate(trials):
        rows = read_results(trial)
        success = VALIDATION + M.env_metric(json.loads((trial / "summary.json").read_text())["env"], M.SUCCESS)
        points = [
            (int(v[VALIDATED_AT]), v[success]) for v in validations_of(rows) if math.isfinite(v.get(success, math.nan))
        ]
        firings = json.loads((trial / "sentinel.json").read_text()) if (trial / "sentinel.json").is_file() else []
        fall = validation_fall(points, drop)
        series = {
            "validation success": points,
            **{name: [(r["training_iteration"], r.get(key, math.nan)) for r in rows] for name, key in SIGNALS.items()},
        }
        for line, (name, values) in enumerate(series.items()):
            ax = axes[line][column]
            ax.plot(*zip(*values), marker=".", color="#1f5fa8")
            for firing in firings:
                ax.axvline(firing["iteration"], color="#c22", lw=1, alpha=0.7)
            if fall is not None:
                ax.axvline(fall, color="black", ls="--", lw=1)
            ax.set_ylabel(name, fontsize=8)
        axes[0][column].set_title(f"{trial.name}: sentinel firings (red), collapse (dashed)", fontsize=9)
        axes[-1][column].set_xlabel("iteration (0: the warm start)")
        first = firings[0] if firings else None
        lead = fall - first["iteration"] if first and fall is not None else "-"
        fired = f"{first['iteration']} ({first['rule']})" if first else "never"
        values = [value for _, value in points]
        lines.append(
            f"| {trial.name} | {values[0]:.3f} / {max(values):.3f} / {values[-1]:.3f} | {fall or 'never'} | "
            f"{fired} | {lead} |"
        )
    fig.tight_layout()
    fig.savefig(run_dir / "echo_trap.png", dpi=110)
    plt.close(fig)
    table = "\n".join(lines) + "\n"
    write_text_atomically(
        run_dir / "echo_trap.md", f"# Echo trap: {run_dir.name}, collapse = a lasting fall of {drop:g}\n\n{table}"
    )
    return table


if __name__ == "__main__":
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--job", choices=("starpo_bandit", "starpo_sokoban"), default="starpo_bandit")
    chooser.add_argument("--fall", type=float, default=0.10)
    chosen, flags = chooser.parse_known_args()
    main_job, config, job = study(chosen.job)
    config, job, demonstrations, baselines = main_job["parse_args"](
        config, job, flags, description=__doc__.splitlines()[0]
    )
    report = run_job(config, job, demonstrations, baselines=baselines)
    run_dir = pathlib.Path(next(iter(report["trials"].values()))["run_dir"]).parent
    print("\n" + write_echo_trap(run_dir, chosen.fall) + f"\nwrote {run_dir / 'echo_trap.png'}")
