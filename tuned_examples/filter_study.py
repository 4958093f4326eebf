"""Which rollout filter? The estimator study's FrozenLake setting once per filter, from one warm start.

Each filter trains the same main job (``--job``, as in ``estimator_study.py``: FrozenLake by default, up to 10
turns of one move, ``gae``, the reward on the turn that earned it) in its own run folder,
``outputs/filter_study/<filter>``. All of them share one warm start (trained once, cached in
``outputs/filter_study/warm_starts``) and play the same held-out states before and after RL. The study then
pairs each filter against ``std`` (StarPO-S's top share by reward std, the first listed) on those states after RL,
sampled and greedy (95% interval, exact McNemar p), and prints a table; ``filter_study.json`` in the output folder
keeps it.

- ``std``: the job's own (the top half of the groups), ``none``: every group;
- RAGEN's strategies at its recommended values: ``top_p`` 0.9 (linear), ``top_k`` 0.25 of the groups,
  ``top_k_abs`` 2 groups, ``min_p`` 0.5 of the best score; ``snr_adaptive`` (RAGEN-2: linear top-p 0.9 over the
  groups with reward variance).

Every flag of the chosen job works and applies to every filter (``--iterations``, ``--seed``, ``--help``);
``--filters std,snr_adaptive`` runs a subset (``std`` first for the pairing). A filter whose run folder exists is
not run again: a stopped study continues where it stopped.

Command:  python tuned_examples/filter_study.py [--filters std,top_p] [--iterations 8] [--validation-size 128]
Time:     about 15-20 minutes on 2 CPU cores at 8 iterations and 128 states (a few minutes a filter)
Expect:   docs/results/filters.md
"""

import argparse
import dataclasses
import json
import math
import pathlib
import runpy
from statistics import mean

from rllib_ragen.jobs.run import run_job
from rllib_ragen.jobs.outputs import read_results, write_text_atomically
from rllib_ragen.jobs.paired_stats import PairedComparison
from rllib_ragen.jobs.report import paired_after_rl

FILTERS = {
    "std": {},  # the job's own
    "none": {"rollout_filter": "none", "rollout_filter_ratio": 1.0},
    "top_p": {"rollout_filter": "top_p", "rollout_filter_value": 0.9},
    "top_k": {"rollout_filter": "top_k", "rollout_filter_value": 0.25},
    "top_k_abs": {"rollout_filter": "top_k_abs", "rollout_filter_value": 2},
    "min_p": {"rollout_filter": "min_p", "rollout_filter_value": 0.5},
    "snr_adaptive": {"rollout_filter": "snr_adaptive"},
}
# The estimator study's FrozenLake warm start (the job's earlier one), which leaves RL room to gain.
WARM_START_FLAGS = ["--warm-start-steps", "300", "--warm-start-episodes", "1000", "--warm-start-lr", "2e-3",
                    "--warm-start-average-decay", "0", "--warm-start-precision", "float32", "--lr", "3e-4"]
OUTPUT_DIR = "outputs/filter_study"  # --output-dir changes it


def trial_of(run: pathlib.Path) -> pathlib.Path:
    """The one trial folder of a filter's run (a Tune experiment of one trial)."""
    (trial,) = [p for p in run.iterdir() if p.is_dir() and (p / "params.json").is_file()]
    return trial


if __name__ == "__main__":
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--filters", default=",".join(FILTERS))
    chosen, flags = chooser.parse_known_args()
    names = chosen.filters.split(",")
    unknown = sorted(set(names) - set(FILTERS))
    if unknown:
        chooser.error(f"--filters: {unknown} are not among {list(FILTERS)}")
    estimator_study = runpy.run_path(str(pathlib.Path(__file__).with_name("estimator_study.py")), run_name="imported")
    main_job, base_config, base_job = estimator_study["study"]("starpo_frozenlake")
    base_job = dataclasses.replace(base_job, output_dir=OUTPUT_DIR, grid=None)
    base_config.training(advantage_estimator="gae")
    config, job, demonstrations, baselines = main_job["parse_args"](
        base_config, base_job, WARM_START_FLAGS + flags, description=__doc__.splitlines()[0])
    out, runs = pathlib.Path(job.output_dir), {}
    for name in names:
        runs[name] = out / f"{name}_seed{config.seed or 0}"
        if runs[name].is_dir():
            print(f"{name}: {runs[name]} exists, not run again")
            continue
        run_job(config.copy(copy_frozen=False).training(**FILTERS[name]),
                dataclasses.replace(job, run_name=runs[name].name), demonstrations, baselines=baselines)

    reference = trial_of(runs[names[0]])
    table = {}
    for name, run in runs.items():
        trial = trial_of(run)
        summary = json.loads((trial / "summary.json").read_text())
        rows = read_results(trial)
        table[name] = {"settings": FILTERS[name], "rl_gain": {"sampled": summary["paired"],
                                                              "greedy": summary["paired_greedy"]},
                       "against_reference": paired_after_rl(reference, trial),
                       "kept_share": mean(r.get("rollout_filter/kept_share", math.nan) for r in rows),
                       "iterations_without_update": sum(r.get("rollout_filter/empty_steps", 0) > 0 for r in rows)}
    write_text_atomically(out / "filter_study.json", json.dumps(table, indent=2, allow_nan=True))
    print(f"\nRL gain of each filter (before -> after RL), and after RL against {names[0]} (it -> the filter), "
          "on the same held-out states; kept: the mean share of groups an update kept")
    for name, entry in table.items():
        print(f"{name} (kept {entry['kept_share']:.2f}, {entry['iterations_without_update']} iterations without an "
              "update)")
        for mode in ("sampled", "greedy"):
            for label, comparison in ((f"RL gain, {mode}", entry["rl_gain"][mode]),
                                      (f"vs {names[0]}, {mode}", entry["against_reference"][mode])):
                if comparison:
                    print(f"  {label:22s}{PairedComparison(**comparison).describe()}")
