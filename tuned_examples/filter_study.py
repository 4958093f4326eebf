"""Which rollout filter? The estimator study's FrozenLake setting with one trial per filter, from one warm start.

One Tune experiment whose grid's variants are the filters (``{"variant": {name: settings}}``): the trials share the
estimator study's FrozenLake job (up to 10 turns of one move, ``gae``, the reward on the turn that earned it, its
short warm start), its seed and its warm start (trained once), and play the same validation states before and after
RL: a short study, 8 iterations and 128 validation maps unless ``--iterations`` and ``--validation-size`` say
otherwise. The report pairs each trial before and after RL, and each filter against ``std`` (StarPO-S's
top share by reward std, the first listed) after RL, sampled and greedy (95% interval, exact McNemar p:
``summary.json``'s ``versus_control``). The study then adds what each filter kept, and prints one table;
``filter_study.json`` in the run folder keeps it.

- ``std``: the job's own (the top half of the groups), ``none``: every group;
- RAGEN's strategies at its recommended values: ``top_p`` 0.9 (linear), ``top_k`` 0.25 of the groups,
  ``top_k_abs`` 2 groups, ``min_p`` 0.5 of the best score; ``snr_adaptive`` (RAGEN-2: linear top-p 0.9 over the
  groups with reward variance).

Every flag of the FrozenLake job works and applies to every filter (``--iterations``, ``--seed``, ``--resume``,
``--help``); ``--filters std,snr_adaptive`` runs a subset (``std`` first for the pairing). A stopped study continues
with ``--resume``: finished trials are not run again.

Command:  python tuned_examples/filter_study.py [--filters std,top_p] [--iterations 8] [--validation-size 128]
Time:     the plan line states it for this CPU (rllib_ragen/jobs/job_times.py)
Expect:   docs/results/filters.md
"""

import argparse
import dataclasses
import json
import math
import pathlib
import runpy
from statistics import mean

from rllib_ragen.jobs.outputs import write_text_atomically
from rllib_ragen.jobs.readers import read_results
from rllib_ragen.jobs.paired_stats import PairedComparison
from rllib_ragen.jobs.run import run_job

FILTERS = {
    "std": {},  # the job's own
    "none": {"rollout_filter": "none", "rollout_filter_ratio": 1.0},
    "top_p": {"rollout_filter": "top_p", "rollout_filter_value": 0.9},
    "top_k": {"rollout_filter": "top_k", "rollout_filter_value": 0.25},
    "top_k_abs": {"rollout_filter": "top_k_abs", "rollout_filter_value": 2},
    "min_p": {"rollout_filter": "min_p", "rollout_filter_value": 0.5},
    "snr_adaptive": {"rollout_filter": "snr_adaptive"},
}


def filter_table(summary: dict, filters: list[str]) -> dict:
    """Per trial (by filter, and seed with several), in the order of ``filters``: its settings, its RL gain, its
    pairing against the first filter's trial of its seed after RL, and what it kept."""
    params = {
        name: json.loads((pathlib.Path(trial["run_dir"]) / "params.json").read_text())
        for name, trial in summary["trials"].items()
    }
    seeds = {p["seed"] for p in params.values()}
    table = {}
    for trial_name in sorted(params, key=lambda t: (params[t]["seed"], filters.index(params[t]["variant"]))):
        trial, name = summary["trials"][trial_name], params[trial_name]["variant"]
        rows = read_results(pathlib.Path(trial["run_dir"]))
        versus = summary["versus_control"].get(trial_name, {})
        key = name if len(seeds) == 1 else f"{name}_seed{params[trial_name]['seed']}"
        table[key] = {
            "settings": FILTERS[name],
            "rl_gain": {"sampled": trial["paired"], "greedy": trial["paired_greedy"]},
            "against_control": {mode: versus.get(mode) for mode in ("sampled", "greedy")},
            "kept_share": mean(r.get("rollout_filter/kept_share", math.nan) for r in rows),
            "iterations_without_update": sum(r.get("rollout_filter/empty_steps", 0) > 0 for r in rows),
        }
    return table


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
    # A short study: 8 iterations, 128 validation maps (the results page's runs).
    base_job = dataclasses.replace(
        base_job,
        output_dir="outputs/filter_study",
        iterations=8,
        timed_command="filter_study.py",
        grid={"variant": {name: FILTERS[name] for name in names}},
    )
    base_config.training(advantage_estimator="gae", validation_size=128)
    config, job, demonstrations, baselines = main_job["parse_args"](
        base_config, base_job, flags, description=__doc__.splitlines()[0]
    )
    summary = run_job(config, job, demonstrations, baselines=baselines)
    table = filter_table(summary, names)
    run_dir = pathlib.Path(next(iter(summary["trials"].values()))["run_dir"]).parent
    write_text_atomically(run_dir / "filter_study.json", json.dumps(table, indent=2, allow_nan=True))
    print(
        f"\nRL gain of each filter (before -> after RL), and after RL against {names[0]} (it -> the filter), "
        "on the same validation states; kept: the mean share of groups an update kept"
    )
    for name, entry in table.items():
        print(
            f"{name} (kept {entry['kept_share']:.2f}, {entry['iterations_without_update']} iterations without an "
            "update)"
        )
        for mode in ("sampled", "greedy"):
            for label, comparison in (
                (f"RL gain, {mode}", entry["rl_gain"][mode]),
                (f"vs {names[0]}, {mode}", entry["against_control"][mode]),
            ):
                if comparison:
                    print(f"  {label:22s}{PairedComparison(**comparison).describe()}")
