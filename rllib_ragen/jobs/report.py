"""The report of a finished run, built from its folder: ``python -m rllib_ragen.jobs.report RUN_DIR``.

Works on any finished Tune experiment of StarPO trials that carried :class:`~rllib_ragen.jobs.callbacks.JobOutputs` (a
main job with one trial or several seeds, a sweep), and on a single trial folder. For each trial it reads Tune's
``result.json`` and ``params.json`` and the callback's rollout files, and builds the trial's summary (validation
before and after RL, the paired comparisons, baselines, validation splits, throughput); it prints the final table.
For an experiment with several trials it adds the spread over trials and either their paired comparisons pooled
into one (:func:`pooled`: seeds of the same settings) or, for a sweep, each trial paired against the trial of the
grid's first values (:func:`versus_control`). Given several run folders (seeds run one at a time), it reports each,
then the spread and the pooled comparison over all their trials.

It writes only where it is told (``output``): the job that made the run writes its ``summary.json`` files,
``learning_curve.png`` and ``rollouts.html`` into it; a reader run later (the command line) writes nothing unless
given ``--output``, a folder outside the run, and judges by the pass bar and reference lines the run recorded. A
reader never writes over what a run recorded.

The verdict judges the headline environment (``readers.headline_environment``); the report still prints every
validation environment's paired line and flags a significant drop on any of them.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from .. import metrics as M
from .callbacks import NEXT_TRAINING_SEED, TIME_BUDGET_STOP
from ..collapse import reasoning_entropy
from .outputs import (
    RunFileError,
    read_run_json,
    AFTER_GREEDY_ROLLOUTS,
    AFTER_ROLLOUTS,
    BASELINES,
    BEFORE_GREEDY_ROLLOUTS,
    LEARNER,
    MACHINE,
    LEARNING_CURVE,
    RUN_CONFIG,
    TRAINING,
    VALIDATED_AT,
    VALIDATION,
    json_ready,
    VIEWER_PAGE,
    SAMPLED_AND_GREEDY,
)
from .readers import (
    RunFolderImportError,
    baseline_name,
    files_in,
    outcome_pair,
    paired_outcomes,
    headline_environment,
    read_first_reasonings,
    read_outcomes,
    read_reasoning_claims,
    read_results,
    scored_environments,
    state_of,
    trial_config,
    trial_folders,
)
from .curves import plot_learning_curve, validations_of
from ..files import write_text_atomically
from .settings import JobSettings
from .validation_states import demonstrated_seeds, initial_states, trained_seeds_by_env
from .paired_stats import paired_by_subset, paired_comparison
from .across_trials import MixedRunsError, pooled, spread, versus_control
from .report_tables import SIGNIFICANT, SUMMARY_METRICS, print_pooled, print_spread, print_table, print_versus

__all__ = ["report_experiment", "report_runs", "report_trial"]


# ---- the report ---------------------------------------------------------------------------------------------------
def report_trial(
    trial: pathlib.Path,
    pass_bar: float | None = None,
    known_scores: dict[str, float] | None = None,
    baselines_dir: pathlib.Path | None = None,
    quiet: bool = False,
    allow_imports: bool = False,
    output: pathlib.Path | None = None,
) -> dict:
    """The trial's summary; its table printed unless ``quiet``. With ``output``, its ``summary.json``,
    ``learning_curve.png`` and ``rollouts.html`` are written into that folder (the job: the trial's own).
    ``pass_bar`` and ``known_scores`` (the curve's reference lines): None for those the run recorded.
    ``baselines_dir``: the folder of scripted baselines' episodes (default: the experiment's)."""
    trial = pathlib.Path(trial)
    config = trial_config(trial, allow_imports)
    recorded = read_run_json(trial / "summary.json", {})
    pass_bar = recorded_pass_bar(trial) if pass_bar is None else pass_bar
    known_scores = dict(recorded.get("known_scores") or {}) if known_scores is None else dict(known_scores)
    rows = read_results(trial)
    validations = validations_of(rows)
    headline = headline_environment(config)
    summary = _summary(config, rows, validations, headline.name)
    summary["success_gain"] = summary["after"][M.SUCCESS] - summary["before"][M.SUCCESS]
    summary["passed"] = bool(summary["success_gain"] >= pass_bar)
    summary["pass_bar"] = pass_bar
    summary["known_scores"] = known_scores
    scored = scored_environments(config)
    summary["paired"] = paired_outcomes(files_in(trial, SAMPLED_AND_GREEDY["sampled"]), scored)
    summary["paired_greedy"] = paired_outcomes(files_in(trial, SAMPLED_AND_GREEDY["greedy"]), scored)
    summary["reasoning_entropy"] = _reasoning_entropy(trial, scored)
    summary["reasoning_grounded"] = _reasoning_grounded(trial, scored)
    baselines_dir = baselines_dir or trial.parent / BASELINES
    baseline_files = sorted(baselines_dir.glob("*.parquet")) if baselines_dir.is_dir() else []
    if baseline_files:
        summary["baselines"] = _against_baselines(trial, baseline_files, headline.name)
    names = [e.name for e in config.validation_environments()]
    if len(names) > 1:
        summary["by_env"] = {
            name: {mode: paired_outcomes(files_in(trial, files), {name}) for mode, files in SAMPLED_AND_GREEDY.items()}
            for name in names
        }
    summary["significant_drops"] = _significant_drops(summary)
    next_seed = int(rows[-1].get(NEXT_TRAINING_SEED, config.train_seed_start)) if rows else config.train_seed_start
    trained = trained_seeds_by_env(config, next_seed)
    for env_name, seeds in demonstrated_seeds(config.model_config["model"]).items():
        trained.setdefault(env_name, []).extend(seeds)
    summary["validation_splits"] = _validation_splits(config, trial, trained)
    sentinel = trial / "sentinel.json"
    summary["sentinel_firings"] = read_run_json(sentinel, [])
    machine = trial / MACHINE
    summary["machine"] = read_run_json(machine, [])  # one entry per session
    summary["run_dir"] = str(trial)
    if output is not None:
        _write_trial_report(trial, pathlib.Path(output), summary, config, rows, validations, headline.name)
    if not quiet:
        print_table(summary, config)
    return summary


def recorded_pass_bar(trial: pathlib.Path) -> float:
    """The pass bar the run was judged by: its job's (``run_config.json`` of the experiment), else the one its
    summary recorded, else the job default."""
    job = read_run_json(trial.parent / RUN_CONFIG, {}).get("job") or read_run_json(trial / RUN_CONFIG, {}).get("job")
    if job and "pass_bar" in job:
        return float(job["pass_bar"])
    recorded = read_run_json(trial / "summary.json", {})
    return float(recorded["pass_bar"]) if "pass_bar" in recorded else JobSettings.pass_bar


def _write_trial_report(
    trial: pathlib.Path, output: pathlib.Path, summary: dict, config, rows, validations, headline: str
) -> None:
    output.mkdir(parents=True, exist_ok=True)
    write_text_atomically(output / "summary.json", json.dumps(json_ready(summary), indent=2, allow_nan=False))
    title = (
        f"{config.env_name} | model {pathlib.Path(str(summary['model'])).name} | seed {config.seed} | "
        f"{summary['iterations']} iterations"
    )
    baseline_lines = {name: b["success"] for name, b in summary.get("baselines", {}).items()}
    plot_learning_curve(
        output / LEARNING_CURVE,
        rows,
        validations,
        config.env_name,
        title,
        {"warm start": summary["before"][M.SUCCESS], **summary["known_scores"], **baseline_lines},
        validation_env=headline,
        firings=summary["sentinel_firings"],
    )
    if (trial / AFTER_ROLLOUTS).is_file():
        from .viewer import write_viewer

        write_viewer(trial, output / VIEWER_PAGE, validation_env=headline)


def report_experiment(
    run_dir: pathlib.Path,
    pass_bar: float | None = None,
    known_scores: dict[str, float] | None = None,
    allow_imports: bool = False,
    output: pathlib.Path | None = None,
) -> dict:
    """Report every trial of the experiment folder ``run_dir`` and, with several, their spread; returns
    ``{"trials": {name: summary}, "spread": ..., "versus_control": ...}``. With ``output`` (the job: ``run_dir``
    itself), the experiment's ``summary.json`` goes there and each trial's files into ``output/<trial>`` (into
    ``output`` when ``run_dir`` is one trial). ``pass_bar``, ``known_scores``: see :func:`report_trial`;
    ``allow_imports``: see :func:`trial_config`."""
    run_dir = pathlib.Path(run_dir)
    trials = trial_folders(run_dir)
    if not trials:
        raise FileNotFoundError(f"{run_dir} holds no finished trial (no */result.json): is it a job's run folder?")
    several = len(trials) > 1
    summaries = {}
    for trial in trials:
        if several:
            print(f"\n== trial {trial.name}")
        where = None if output is None else pathlib.Path(output) / trial.relative_to(run_dir)
        summaries[trial.name] = report_trial(
            trial, pass_bar, known_scores, run_dir / BASELINES, allow_imports=allow_imports, output=where
        )
    sweep = several and bool(read_run_json(run_dir / RUN_CONFIG, {}).get("job", {}).get("grid"))
    report = {
        "trials": summaries,
        "spread": spread(summaries.values()) if several else None,
        "pooled": pooled(trials, allow_imports) if several and not sweep else None,  # a sweep's trials differ
        "versus_control": versus_control(run_dir, trials, allow_imports) if sweep else {},
    }
    if several:
        print_spread(report["spread"])
        print_pooled(report["pooled"] or {})
        print_versus(report["versus_control"])
    if output is not None and trials != [run_dir]:
        write_text_atomically(
            pathlib.Path(output) / "summary.json", json.dumps(json_ready(report), indent=2, allow_nan=False)
        )
    return report


def report_runs(
    run_dirs: list[pathlib.Path],
    pass_bar: float | None = None,
    allow_imports: bool = False,
    output: pathlib.Path | None = None,
) -> dict:
    """Several run folders of the same settings, e.g. seeds run one at a time: each reported as
    :func:`report_experiment` does (with ``output``, into ``output/<run folder's name>``), then the spread and the
    pooled paired comparisons over all their trials; returns ``{"runs": {path: report}, "spread", "pooled"}``, also
    written to ``output/summary.json``. Runs whose trials score different environments are refused before any
    report (:class:`~rllib_ragen.jobs.across_trials.MixedRunsError`)."""
    run_dirs = [pathlib.Path(run_dir) for run_dir in run_dirs]
    together = pooled([trial for run_dir in run_dirs for trial in trial_folders(run_dir)], allow_imports)
    runs = {}
    for run_dir in run_dirs:
        print(f"\n==== run {run_dir}")
        where = None if output is None else pathlib.Path(output) / run_dir.name
        runs[str(run_dir)] = report_experiment(run_dir, pass_bar, allow_imports=allow_imports, output=where)
    report = {
        "runs": runs,
        "spread": spread([summary for run in runs.values() for summary in run["trials"].values()]),
        "pooled": together,
    }
    print(f"\n==== the {len(run_dirs)} runs together")
    print_spread(report["spread"])
    print_pooled(report["pooled"])
    if output is not None:
        write_text_atomically(
            pathlib.Path(output) / "summary.json", json.dumps(json_ready(report), indent=2, allow_nan=False)
        )
    return report


# ---- the summary's parts ----------------------------------------------------------------------------------------
def _summary(config, rows: list[dict], validations: list[dict], headline: str) -> dict:
    measured_before = bool(validations) and validations[0][VALIDATED_AT] == 0

    def val(index: int, name: str) -> float:
        key = VALIDATION + M.env_metric(headline, name)
        return validations[index].get(key, math.nan) if validations else math.nan

    pooled = TRAINING + M.POOLED + "/"
    generated = sum(
        r.get(pooled + M.RESPONSE_TOKENS_PER_TURN, 0)
        * r.get(pooled + M.NUM_TURNS, 0)
        * r.get(pooled + M.NUM_TRAJECTORIES, 0)
        for r in rows
    )
    generate_s = sum(r.get(TRAINING + M.TIME_GENERATE, 0) for r in rows)
    return {
        "env": headline,
        "model": config.model_config["model"],
        "seed": config.seed,
        "iterations": int(rows[-1]["training_iteration"]) if rows else 0,
        "ended_by_time_budget": bool(rows[-1].get("job/" + TIME_BUDGET_STOP, 0.0)) if rows else False,
        "validation_episodes": int(val(-1, M.NUM_TRAJECTORIES)) if validations else 0,
        "validation_temperature": config.validation_temperature,
        # NaN, not the first later validation, when nothing was measured before RL
        "before": {n: val(0, n) if measured_before else math.nan for n in SUMMARY_METRICS},
        "after": {n: val(-1, n) for n in SUMMARY_METRICS},
        "validated_at": [int(v[VALIDATED_AT]) for v in validations],
        "rollout_tokens_per_s": generated / generate_s if generate_s else math.nan,
        "update_tokens_per_s": rows[-1].get(LEARNER + M.UPDATE_TOKENS_PER_S, math.nan) if rows else math.nan,
        # Tune's clock of the trial, over every session of a restored one (the warm start is not in it)
        "wall_time_s": rows[-1].get("time_total_s", math.nan) if rows else math.nan,
        # the trial's process at its fullest over the iterations (runs before this metric: NaN)
        "peak_rss_gib": max((v for r in rows if math.isfinite(v := r.get(M.PEAK_RSS, math.nan))), default=math.nan),
    }


def _significant_drops(summary: dict) -> list[str]:
    """Every paired comparison in the summary that fell with p below :data:`SIGNIFICANT`, named."""
    found = [
        ("headline " + mode, summary.get(key)) for mode, key in (("sampled", "paired"), ("greedy", "paired_greedy"))
    ]
    found += [(f"{env} {mode}", c) for env, modes in (summary.get("by_env") or {}).items() for mode, c in modes.items()]
    return [name for name, c in found if c and c["difference"] < 0 and c["p_value"] < SIGNIFICANT]


def _validation_file_pairs(folder: pathlib.Path):
    for mode, (before, after) in SAMPLED_AND_GREEDY.items():
        if (folder / before).is_file() and (folder / after).is_file():
            yield mode, folder / before, folder / after


def _reasoning_entropy(folder: pathlib.Path, envs: set[str] | None) -> dict | None:
    """The entropy of the first turn's reasoning over the validation episodes before and after RL, sampled and
    greedy (``collapse.reasoning_entropy``, nats); None where the replies carry no reasoning."""
    result = {}
    for mode, before_file, after_file in _validation_file_pairs(folder):
        before, after = (read_first_reasonings(path, envs) for path in (before_file, after_file))
        if before is not None and after is not None and (any(before) or any(after)):
            result[mode] = {
                "before": reasoning_entropy(before),
                "after": reasoning_entropy(after),
                "episodes": len(after),
            }
    return result or None


def _reasoning_grounded(folder: pathlib.Path, envs: set[str] | None) -> dict | None:
    """The share of the checkable claims about the state in the validation episodes' reasoning that held, before
    and after RL (``TextEnv.reasoning_claims``); None where the environment checked none."""
    result = {}
    for mode, before_file, after_file in _validation_file_pairs(folder):
        (checked_before, true_before), (checked_after, true_after) = (
            read_reasoning_claims(path, envs) for path in (before_file, after_file)
        )
        if checked_before and checked_after:
            result[mode] = {
                "before": true_before / checked_before,
                "after": true_after / checked_after,
                "claims_before": checked_before,
                "claims_after": checked_after,
            }
    return result or None


def _against_baselines(trial: pathlib.Path, files: list[pathlib.Path], headline: str) -> dict:
    """Per baseline: its success on the states it played, and the greedy agent paired against it before and after
    RL ("before" is the baseline, "after" the agent: "improved" counts the states the agent solves and the baseline
    fails)."""
    result = {}
    for file in files:
        outcomes = read_outcomes(file)
        entry = {"file": str(file), "states": len(outcomes), "success": sum(outcomes.values()) / max(len(outcomes), 1)}
        for when, agent in (("warm_start", BEFORE_GREEDY_ROLLOUTS), ("after_rl", AFTER_GREEDY_ROLLOUTS)):
            pair = outcome_pair((file, trial / agent), {headline})
            entry[when] = None if pair is None else paired_comparison(*pair).as_dict()
        result[baseline_name(file)] = entry
    return result


def _validation_splits(config, trial: pathlib.Path, trained: dict[str, list[int]]) -> dict | None:
    """Validation success on the headline environment's validation states, split by whether training ever showed
    the state and by its optimal solution length (where the environment computes one), sampled and greedy."""
    headline = headline_environment(config)
    builds = (headline.env, headline.env_config)
    pairs = {
        mode: outcome_pair((trial / files[0], trial / files[1]), {headline.name})
        for mode, files in SAMPLED_AND_GREEDY.items()
    }
    pairs = {mode: pair for mode, pair in pairs.items() if pair is not None}
    if not pairs:
        return None
    states = next(iter(pairs.values()))[0].keys()
    seed_of = {state: state_of(state)[1] for state in states}
    described = initial_states(*builds, set(seed_of.values()), solution_lengths=True)
    trained_here = [
        seed
        for e in config.training_environments()
        if (e.env, e.env_config) == builds
        for seed in trained.get(e.name, [])
    ]
    seen = {key for key, _ in initial_states(*builds, trained_here).values()}
    seen_label = {s: "seen in training" if described[seed_of[s]][0] in seen else "unseen" for s in states}
    result = {
        "env": headline.name,
        "training_states": len(seen),
        "unseen_states": sum(label == "unseen" for label in seen_label.values()),
        "by_seen": {name: paired_by_subset(*pair, seen_label) for name, pair in pairs.items()},
    }
    lengths = {s: described[seed_of[s]][1] for s in states}
    if any(length is not None for length in lengths.values()):
        result["by_solution_length"] = {name: paired_by_subset(*pair, lengths) for name, pair in pairs.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rllib_ragen.jobs.report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "run_dirs",
        type=pathlib.Path,
        nargs="+",
        metavar="RUN_DIR",
        help="a job's run folder (a Tune experiment) or one trial's; several (e.g. seeds run one at a time): each "
        "reported, then all their trials' paired comparisons pooled",
    )
    parser.add_argument(
        "--pass-bar",
        type=float,
        default=None,
        help="least success gain that counts as learning (default: the bar the run's job used)",
    )
    parser.add_argument(
        "--output",
        type=pathlib.Path,
        default=None,
        help="write summary.json, learning_curve.png and rollouts.html into this folder, one "
        "subfolder a trial; it must lie outside the run (default: write nothing)",
    )
    parser.add_argument(
        "--allow-run-imports",
        action="store_true",
        help="import the modules the run's settings name (a TRL environment's import path): that "
        "runs their code, so only for a run you trust",
    )
    args = parser.parse_args(argv)
    run_dirs = [run_dir.resolve() for run_dir in args.run_dirs]
    output = args.output.resolve() if args.output is not None else None
    for given, run_dir in zip(args.run_dirs, run_dirs):
        if not run_dir.is_dir():
            parser.error(f"{given} is not a folder")
        if output is not None and (output == run_dir or run_dir in output.parents):
            parser.error(
                f"--output {args.output} lies inside the run {given}: the report never writes over what "
                f"a run recorded; choose a folder outside it"
            )
    if output is not None and len({run_dir.name for run_dir in run_dirs}) < len(run_dirs):
        parser.error("--output writes each run into a folder of its name, and two of these runs share a name")
    try:
        if len(run_dirs) == 1:
            report_experiment(run_dirs[0], args.pass_bar, allow_imports=args.allow_run_imports, output=output)
        else:
            report_runs(run_dirs, args.pass_bar, args.allow_run_imports, output)
    except (FileNotFoundError, RunFolderImportError, RunFileError, MixedRunsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if output is not None:
        print(f"report written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
