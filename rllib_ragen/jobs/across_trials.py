"""What a report says across trials: the spread of their results, their paired comparisons pooled into one (seeds of
the same settings, in one experiment or in several run folders), and a sweep's trials each against its control.
Read from the trials' folders and summaries; nothing here writes."""

from __future__ import annotations

import json
import math
import pathlib
import statistics

from .. import metrics as M
from .outputs import RUN_CONFIG, SAMPLED_AND_GREEDY, read_run_json
from .paired_stats import pooled_comparison
from .readers import (
    files_in,
    headline_environment,
    outcome_pair,
    paired_outcomes,
    scored_environments,
    trial_config,
    trial_params,
)

__all__ = ["MixedRunsError", "paired_after_rl", "pooled", "spread", "versus_control"]


class MixedRunsError(ValueError):
    """Trials whose comparisons cannot be pooled: they score different environments, or one is given twice."""


def pooled(trials: list[pathlib.Path], allow_imports: bool = False) -> dict:
    """Every trial's validation states before and after RL pooled into one paired comparison a mode
    (:func:`~rllib_ragen.jobs.paired_stats.pooled_comparison`), on the states each trial's own paired line scores:
    ``{mode: {"trials": [trial paths pooled], **comparison} or None}``. A trial without a mode's two files is left
    out of that mode, and named by its absence. Trials with different headline environments, or a trial given twice,
    are refused (:class:`MixedRunsError`)."""
    paths = [pathlib.Path(trial).resolve() for trial in trials]
    twice = sorted({str(trial) for trial in paths if paths.count(trial) > 1})
    if twice:
        raise MixedRunsError(f"these trials are given twice, and their states would count twice: {twice}")
    configs = {trial: trial_config(trial, allow_imports) for trial in paths}
    headlines = {trial: headline_environment(config).name for trial, config in configs.items()}
    if len(set(headlines.values())) > 1:
        named = {str(trial): name for trial, name in headlines.items()}
        raise MixedRunsError(f"these trials score different environments, and pooling them means nothing: {named}")
    result = {}
    for mode, files in SAMPLED_AND_GREEDY.items():
        pairs = {}
        for trial, config in configs.items():
            pair = outcome_pair(files_in(trial, files), scored_environments(config))
            if pair is not None:
                pairs[str(trial)] = pair
        result[mode] = {"trials": sorted(pairs), **pooled_comparison(pairs).as_dict()} if pairs else None
    return result


def spread(summaries) -> dict:
    """Mean, standard deviation, least and most over trials of validation success before and after RL and of the
    gain (each trial, e.g. each seed, counts once)."""
    values = {
        "before": [s["before"][M.SUCCESS] for s in summaries],
        "after": [s["after"][M.SUCCESS] for s in summaries],
        "success_gain": [s["success_gain"] for s in summaries],
    }
    result = {}
    for name, series in values.items():
        finite = [v for v in series if math.isfinite(v)]
        result[name] = {
            "mean": statistics.fmean(finite) if finite else math.nan,
            "std": statistics.stdev(finite) if len(finite) > 1 else math.nan,
            "min": min(finite, default=math.nan),
            "max": max(finite, default=math.nan),
            "trials": len(finite),
        }
    return result


def versus_control(run_dir: pathlib.Path, trials: list[pathlib.Path], allow_imports: bool = False) -> dict:
    """In a sweep (the run's ``--grid``), each trial paired against its control: the trial of the same seed with
    every grid field at its first listed value (or the first named variant), on the same validation states after
    RL, sampled and greedy ("before" is the control, "after" the trial). ``{}`` without a grid."""
    record = run_dir / RUN_CONFIG
    grid = read_run_json(record, {}).get("job", {}).get("grid")
    if not grid:
        return {}

    def point(params: dict) -> str:  # compared as JSON: 1e-4 from the command line equals Tune's 0.0001
        return json.dumps([params.get(name) for name in grid], default=str)

    params = {trial: trial_params(trial) for trial in trials}
    control_point = json.dumps([next(iter(values)) for values in grid.values()], default=str)  # a list or variants
    controls = {p.get("seed"): trial for trial, p in params.items() if point(p) == control_point}
    result = {}
    for trial, p in params.items():
        control = controls.get(p.get("seed"))
        if control is None or control == trial:
            continue
        result[trial.name] = {"control": control.name, **paired_after_rl(control, trial, allow_imports)}
    return result


def paired_after_rl(control: pathlib.Path, trial: pathlib.Path, allow_imports: bool = False) -> dict:
    """Two trials' policies after RL on the same validation states, sampled and greedy: ``{mode: comparison}``
    ("before" is ``control``, "after" ``trial``; None where the states differ), on the headline environment."""
    scored = scored_environments(trial_config(trial, allow_imports))
    return {
        mode: paired_outcomes((control / files[1], trial / files[1]), scored)
        for mode, files in SAMPLED_AND_GREEDY.items()
    }
