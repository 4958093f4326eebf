"""What the report prints: a trial's final table, its paired lines, the baselines and the verdict; the spread over
trials and a sweep's trials against its control. Read from the summaries ``report.py`` builds."""

from __future__ import annotations

import math

from .. import metrics as M
from .outputs import SAMPLED_AND_GREEDY
from .paired_stats import PairedComparison


SUMMARY_METRICS = (M.SUCCESS, "pass@1", M.VALID_ACTION_RATE, M.FORMAT_ERROR_RATE, M.RETURN_MEAN, M.NUM_ACTIONS)


SIGNIFICANT = 0.05  # a paired drop with a smaller p-value is flagged, on whichever environment it happens


def print_versus(versus: dict) -> None:
    for name, entry in versus.items():
        print(f"{name} against {entry['control']} after RL (the same states):")
        for mode in SAMPLED_AND_GREEDY:
            if entry[mode]:
                print(f"  {mode:26s}{PairedComparison(**entry[mode]).describe()}")


def print_spread(result: dict) -> None:
    print(f"\nover {result['after']['trials']} trials (mean ± std [min, max]):")
    for name, cell in result.items():
        print(f"  {name:26s}{cell['mean']:+.3f} ± {cell['std']:.3f} [{cell['min']:+.3f}, {cell['max']:+.3f}]")


def print_pooled(pooled: dict) -> None:
    """Each mode's comparison pooled over trials (``across_trials.pooled``), naming how many trials it holds."""
    for mode, entry in pooled.items():
        if entry:
            comparison = PairedComparison(**{k: v for k, v in entry.items() if k != "trials"})
            label = f"pooled {mode}, {len(entry['trials'])} trials"
            print(f"  {label:26s}{comparison.describe()}")


def describe_machine(machine: dict) -> str:
    """One session's machine (``machine.json``) on one line."""
    gpus = f", {', '.join(machine['gpus'])}" if machine.get("gpus") else ""
    packages = ", ".join(
        f"{name} {version}"
        for name, version in machine.get("packages", {}).items()
        if name in ("torch", "transformers") and version
    )
    return (
        f"{machine.get('cpu')} ({machine.get('cpu_kernels')} kernels, {machine.get('torch_threads')} torch "
        f"threads){gpus}; {packages}"
    )


def print_table(summary: dict, config) -> None:
    """The final table, the paired lines (every validation environment's), the baselines and the verdict."""
    print(
        f"\n{summary['env']}, model {summary['model']}, {summary['iterations']} iterations, validation on "
        f"{summary['validation_episodes']} validation initial states (temperature {config.validation_temperature})"
    )
    if summary.get("ended_by_time_budget"):
        print(f"the trial's time budget (max_minutes) ended it after iteration {summary['iterations']}")
    print(f"{'':28s}{'before':>10s}{'after':>10s}")

    def cell(value: float) -> str:
        return f"{value:10.3f}" if math.isfinite(value) else f"{'-':>10s}"

    for name in SUMMARY_METRICS:
        print(f"{name:28s}{cell(summary['before'][name])}{cell(summary['after'][name])}")
    print(f"{'rollout tokens/s':28s}{summary['rollout_tokens_per_s']:20,.0f}")
    print(f"{'update tokens/s':28s}{summary['update_tokens_per_s']:20,.0f}")
    print(f"{'wall time':28s}{summary['wall_time_s'] / 60:17.1f} min")
    if math.isfinite(summary.get("peak_rss_gib", math.nan)):
        print(f"{'peak RSS, trial process':28s}{summary['peak_rss_gib']:17.1f} GiB")
    for machine in summary.get("machine", []):
        print(f"{'machine':28s}{describe_machine(machine)}")
    print_paired(summary, config)
    gain, bar = summary["success_gain"], summary["pass_bar"]
    if math.isfinite(gain):
        print(
            f"success gain on {summary['env']} {gain:+.3f} (bar {bar}): "
            f"{'PASS' if summary['passed'] else 'below the bar'}"
        )
    else:
        print(
            f"success gain not measured: no validation before RL (validate_before_training=False), so the bar "
            f"({bar}) is not judged"
        )
    for line in greedy_against_baselines(summary):
        print(line)
    for drop in summary["significant_drops"]:
        print(
            f"WARNING: validation success fell significantly on {drop} (p < {SIGNIFICANT}): see the paired lines "
            "above and the viewer (rollouts.html)"
        )


def greedy_against_baselines(summary: dict) -> list[str]:
    """One plain sentence per baseline: is the trained agent's greedy play better than it, worse, or not told
    apart (paired on the same states, p < ``SIGNIFICANT``)? A sampled gain can hide a greedy policy no better
    than random moves; this says so at the end of the table."""
    lines = []
    for name, baseline in (summary.get("baselines") or {}).items():
        if not baseline.get("after_rl"):
            continue
        c = PairedComparison(**baseline["after_rl"])
        verdict = (
            ("better than" if c.difference > 0 else "worse than")
            if c.p_value < SIGNIFICANT
            else "not distinguishable from"
        )
        lines.append(
            f"greedy play after RL is {verdict} the baseline '{name}': {c.after:.3f} against {c.before:.3f} "
            f"on the same {c.n} states (p = {c.p_value:.2g})"
        )
    return lines


def print_paired(summary: dict, config) -> None:
    for key, label in (("paired", f"paired, T={config.validation_temperature:g}"), ("paired_greedy", "paired, greedy")):
        if summary.get(key):
            print(f"{label:28s}{PairedComparison(**summary[key]).describe()}")
    for mode, grounded in (summary.get("reasoning_grounded") or {}).items():
        print(
            f"{'reasoning grounded, ' + mode:28s}{grounded['before']:.3f} -> {grounded['after']:.3f} of "
            f"{grounded['claims_before']} -> {grounded['claims_after']} checked claims about the state"
        )
    for mode, entropy in (summary.get("reasoning_entropy") or {}).items():
        # log n is the most it can be: every episode reasoning differently
        print(
            f"{'reasoning entropy, ' + mode:28s}{entropy['before']:.3f} -> {entropy['after']:.3f} nats over "
            f"{entropy['episodes']} first turns (at most {math.log(max(entropy['episodes'], 1)):.2f})"
        )
    if any(any(comparisons.values()) for comparisons in (summary.get("by_env") or {}).values()):
        print("validation environments, paired before -> after:")
        for env, comparisons in summary["by_env"].items():
            for mode, comparison in comparisons.items():
                if comparison:
                    print(f"  {env:40s}{mode:9s}{PairedComparison(**comparison).describe()}")
    for name, baseline in (summary.get("baselines") or {}).items():
        print(f"against the baseline '{name}' (it -> the greedy agent, on the same {baseline['states']} states):")
        for when, label in (("warm_start", "warm start"), ("after_rl", "after RL")):
            if baseline[when]:
                print(f"  {label:26s}{PairedComparison(**baseline[when]).describe()}")
    splits = summary.get("validation_splits") or {}
    for name, subsets in splits.get("by_seen", {}).items():
        if isinstance(subsets.get("unseen"), dict) and "p_value" in subsets["unseen"]:
            print(f"{'unseen states, ' + name:28s}{PairedComparison(**subsets['unseen']).describe()}")
    for name, subsets in splits.get("by_solution_length", {}).items():
        cells = ", ".join(
            f"{length}: {c['before']:.2f}->{c['after']:.2f} (n={c['n']})" for length, c in subsets.items()
        )
        print(f"{'by solution length, ' + name:28s}{cells}")
