"""Paired comparison of two policies on the same validation states: the difference, a 95% interval, a p-value.

A learning claim compares the *same* states before and after: each state's outcome under the warm start is paired
with its outcome under the trained policy, so the state-to-state variation (some levels are easy for both) drops
out of the interval. For 0/1 outcomes (success) the p-value is the exact McNemar test: under "no change" the states
that flipped are equally likely to have flipped either way, so the number that improved is Binomial(flips, 1/2).

Example::

    before = {t.seed: float(t.success) for t in algo_before.last_validation}
    after = {t.seed: float(t.success) for t in algo_after.last_validation}
    print(paired_comparison(before, after).describe())   # "<before> -> <after>, <gain> [<low>, <high>], p = <p> ..."
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

__all__ = ["PairedComparison", "paired_comparison", "pooled_comparison", "exact_mcnemar_p"]

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """``after - before`` over ``n`` states, with the normal 95% interval of the mean paired difference.

    ``improved``/``worsened`` count the states whose outcome went up/down; ``p_value`` is the exact McNemar test
    for 0/1 outcomes and a paired sign test on the states that changed otherwise (the same formula).
    """

    n: int
    before: float
    after: float
    difference: float
    ci_low: float
    ci_high: float
    improved: int
    worsened: int
    p_value: float

    def describe(self) -> str:
        return (
            f"{self.before:.3f} -> {self.after:.3f}, {self.difference:+.3f} [{self.ci_low:+.3f}, "
            f"{self.ci_high:+.3f}], p = {self.p_value:.2g} ({self.improved} states up, {self.worsened} down, "
            f"n = {self.n})"
        )

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def paired_comparison(before: Mapping, after: Mapping) -> PairedComparison:
    """Compare per-state outcomes keyed by state (e.g. reset seed). Both must hold the same states."""
    if set(before) != set(after):
        missing = sorted(set(before) ^ set(after), key=str)[:5]
        raise ValueError(f"before and after must cover the same states; these are in one only: {missing} ...")
    if len(before) < 2:
        raise ValueError(f"a paired comparison needs at least 2 states, got {len(before)}.")
    keys = sorted(before, key=str)
    diffs = [float(after[k]) - float(before[k]) for k in keys]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = Z_95 * sd / math.sqrt(n)
    improved = sum(d > 0 for d in diffs)
    worsened = sum(d < 0 for d in diffs)
    return PairedComparison(
        n=n,
        before=sum(float(before[k]) for k in keys) / n,
        after=sum(float(after[k]) for k in keys) / n,
        difference=mean,
        ci_low=mean - half,
        ci_high=mean + half,
        improved=improved,
        worsened=worsened,
        p_value=exact_mcnemar_p(improved, worsened),
    )


def pooled_comparison(pairs: Mapping[str, tuple[Mapping, Mapping]]) -> PairedComparison:
    """:func:`paired_comparison` over several runs at once, ``{run: (before, after)}``: each run's states are paired
    within the run and each (run, state) counts once, so three seeds of 256 states make 768 pairs. The interval
    treats the pairs as independent: it holds how much states differ, not how much seeds do (the spread over
    trials shows that)."""
    before = {(run, state): value for run, (outcomes, _) in pairs.items() for state, value in outcomes.items()}
    after = {(run, state): value for run, (_, outcomes) in pairs.items() for state, value in outcomes.items()}
    return paired_comparison(before, after)


def paired_by_subset(before: Mapping, after: Mapping, label_of: Mapping) -> dict:
    """:func:`paired_comparison` within each subset of states, keyed by ``label_of[state]`` (e.g. the optimal
    solution length), as dicts in label order. A subset of fewer than 2 states gets only its size and means."""
    subsets: dict = {}
    for key in before:
        subsets.setdefault(label_of[key], []).append(key)
    out = {}
    for label in sorted(subsets, key=lambda v: (v is None, 0 if v is None else v)):  # 2 before 10; None last
        keys = subsets[label]
        if len(keys) >= 2:
            out[label] = paired_comparison({k: before[k] for k in keys}, {k: after[k] for k in keys}).as_dict()
        else:
            out[label] = {"n": len(keys), "before": float(before[keys[0]]), "after": float(after[keys[0]])}
    return out


def exact_mcnemar_p(improved: int, worsened: int) -> float:
    """Two-sided exact McNemar p-value: scipy's exact binomial test of ``improved`` of the flipped states against
    1/2 (no flips: no evidence, and the p-value is 1)."""
    from scipy.stats import binomtest

    flips = improved + worsened
    return 1.0 if flips == 0 else float(binomtest(improved, flips, 0.5).pvalue)
