"""Reward-variance rollout filtering: train on the groups whose outcomes vary most.

Two families, both scoring each group (one initial state, N episodes) by the spread of its episodes' returns:

- ``std`` / ``reversed_std``: StarPO-S (arXiv 2504.20073 sec. 4.2) keeps the top (bottom) share of groups by their
  within-group std, ``ceil(ratio x groups)`` of them.
- ``top_p``, ``top_k``, ``top_k_abs``, ``min_p``: the strategies of RAGEN's ``rollout_filter_strategy``
  (``config/base.yaml``), over its ``reward_variance`` score, the within-group sample std (Bessel-corrected, as
  ``torch.std``), with its ``rollout_filter_type`` (keep the ``largest`` or ``smallest`` scores) and
  ``include_zero``. ``snr_adaptive`` is RAGEN-2's SNR-Adaptive Filtering (arXiv 2604.06268): linear top-p over
  that score with zero-variance groups dropped first, a top-p of 0.9 by default.

``top_p``, ``min_p`` and ``snr_adaptive`` keep a number of groups that depends on the rollout, and can keep none:
an update is then skipped (counted as ``rollout_filter/empty_steps``). ``StarPOConfig.validate`` checks every
setting; this module trusts them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import metrics as M
from ..ranges import ABOVE_ZERO_TO_ONE

FILTER_MODES = ("std", "reversed_std", "top_p", "top_k", "top_k_abs", "min_p", "snr_adaptive", "none")
RAGEN_STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p", "snr_adaptive")  # score: the sample std
VARIABLE_COUNT_FILTERS = ("top_p", "min_p", "snr_adaptive")  # how many they keep depends on the rollout
FILTER_TYPES = ("largest", "smallest")
TOP_P_MODES = ("linear", "softmax")
SNR_ADAPTIVE_TOP_P = 0.9  # RAGEN-2's recommended p
ZERO_SCORE = 1e-10  # RAGEN's: a score at most this is a zero-variance group


# The share of groups std and reversed_std keep: something, up to all (the knob rollout_filter_ratio, a sentinel
# rule's rollback of it, and RAGEN's fractional thresholds: top_p, snr_adaptive, top_k, min_p).
RATIO_RANGE = ABOVE_ZERO_TO_ONE


@dataclass(frozen=True)
class FilterSettings:
    """One rollout filter. ``ratio`` is the share ``std``/``reversed_std`` keep; ``value`` the threshold of the
    RAGEN's strategies (None: ``snr_adaptive``'s 0.9); ``include_zero`` None: the strategy's own (True, and
    False for ``snr_adaptive``). The rest are RAGEN's ``rollout_filter_*`` keys of the same names."""

    mode: str = "std"
    ratio: float = 0.25  # within RATIO_RANGE
    value: float | None = None
    filter_type: str = "largest"
    include_zero: bool | None = None
    top_p_mode: str = "linear"
    selection_eps: float = 0.01

    @property
    def keeps_zero_score_groups(self) -> bool:
        if self.include_zero is not None:
            return self.include_zero
        return self.mode != "snr_adaptive"

    @property
    def threshold(self) -> float:
        return SNR_ADAPTIVE_TOP_P if self.value is None and self.mode == "snr_adaptive" else float(self.value)


def num_kept_groups(num_groups: int, keep_ratio: float, mode: str = "std") -> int:
    """How many of ``num_groups`` groups ``std``/``reversed_std`` keep: ``ceil(keep_ratio * num_groups)``, at least
    one; ``none`` keeps every group.

    RAGEN keeps ``int(ratio * groups)``, which can be 0; the ceiling never empties a batch. The 1e-9
    absorbs float error (0.3 * 10 = 3.0000000000000004).
    """
    if mode == "none":
        return num_groups
    return max(1, math.ceil(keep_ratio * num_groups - 1e-9))


def fixed_kept_groups(num_groups: int, settings: FilterSettings) -> int | None:
    """How many of ``num_groups`` groups ``settings`` keeps whatever the rollout, or None when that depends on
    the rollout: ``top_p``, ``min_p``, ``snr_adaptive``, and ``top_k``/``top_k_abs`` without zero-variance groups
    (fewer may be left than k)."""
    if settings.mode in ("std", "reversed_std", "none"):
        return num_kept_groups(num_groups, settings.ratio, settings.mode)
    if (
        settings.mode in VARIABLE_COUNT_FILTERS
        or settings.mode not in FILTER_MODES
        or settings.value is None
        or not settings.keeps_zero_score_groups
    ):
        return None  # (or not a valid filter, which StarPOConfig.validate reports)
    k = int(settings.threshold * num_groups) if settings.mode == "top_k" else int(settings.threshold)
    return max(1, min(k, num_groups))


def ragen_selection(scores: torch.Tensor, settings: FilterSettings) -> torch.Tensor:
    """The positions in ``scores`` (one per group) that one of RAGEN's strategies keeps, as RAGEN's rollout filter
    defines them (``ragen/trainer/rollout_filter.py``, ``_select_top_groups``):

    - groups scoring at most 1e-10 are dropped first unless ``include_zero``;
    - ``top_p``, linear: sort (descending for ``largest``), then take groups while the running sum is below
      ``value x sum(all scores) - selection_eps`` and the next score is positive; keep them if the sum reached
      the threshold, else none. ``value >= 1`` keeps all. Softmax: softmax of the scores (negated for
      ``smallest``), and the fewest most probable groups whose cumulative probability reaches ``value``.
    - ``top_k``: the ``max(1, min(int(value x groups), candidates))`` best; ``top_k_abs``: ``int(value)`` of them.
    - ``min_p``: ``largest`` keeps scores >= ``value x max``; ``smallest`` keeps scores <= ``min / value``.

    Ties keep the lower position first (a stable sort), where RAGEN's ``topk`` leaves them unspecified.
    """
    scores = scores.double()
    num_groups, positions = len(scores), torch.arange(len(scores))
    if not settings.keeps_zero_score_groups:
        nonzero = scores.abs() > ZERO_SCORE
        scores, positions = scores[nonzero], positions[nonzero]
        if not len(scores):
            return positions
    value, largest = settings.threshold, settings.filter_type == "largest"
    ranked = torch.sort(scores, descending=largest, stable=True).indices
    strategy = "top_p" if settings.mode == "snr_adaptive" else settings.mode
    if strategy == "top_p":
        if value >= 1.0:
            return positions
        if settings.top_p_mode == "softmax" and settings.mode != "snr_adaptive":
            probabilities = torch.softmax(scores if largest else -scores, dim=0)
            order = torch.sort(probabilities, descending=True, stable=True).indices
            reached = torch.searchsorted(torch.cumsum(probabilities[order], 0), torch.tensor(value, dtype=torch.double))
            return positions[order[: min(int(reached) + 1, len(scores))]]
        threshold = value * float(scores.sum()) - settings.selection_eps
        total, count = 0.0, 0
        for score in scores[ranked].tolist():
            if total >= threshold or score <= 0:
                break
            total, count = total + score, count + 1
        return positions[ranked[:count]] if total >= threshold else positions[:0]
    if strategy in ("top_k", "top_k_abs"):
        k = int(value * num_groups) if strategy == "top_k" else int(value)  # top_k: a share of all groups
        return positions[ranked[: max(1, min(k, len(scores)))]]
    # min_p
    if largest:
        return positions[scores >= scores.max() * value - ZERO_SCORE]
    return positions[scores <= scores.min() / (value + ZERO_SCORE) + ZERO_SCORE]


def select_groups(
    returns: torch.Tensor,
    group_ids: torch.Tensor,
    keep_ratio: float = FilterSettings.ratio,
    mode: str = "std",
    strata: torch.Tensor | None = None,
    settings: FilterSettings | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Keep the groups a filter selects from the within-group spread of trajectory returns.

    ``std`` keeps the :func:`num_kept_groups` most uncertain groups (StarPO-S: top 25% by default),
    ``reversed_std`` the least uncertain ones (an ablation), ``none`` everything; ties break by lower group id, so
    the choice is deterministic. RAGEN's strategies select as :func:`ragen_selection` says.

    Args:
        returns: (B,) trajectory returns.
        group_ids: (B,) group of each trajectory.
        keep_ratio, mode: ``std``'s share and the filter's name, when ``settings`` is not given.
        strata: (B,) optional label of each trajectory (its training environment, all of a group's the same):
            groups are then ranked and kept within each stratum.
        settings: the whole filter (``StarPOConfig.filter_settings()``).

    Returns:
        keep (B,) bool mask of kept trajectories (possibly none), and metrics on reward std/mean/max over all and
        kept groups, the share of groups kept and the number of zero-variance groups.
    """
    settings = settings or FilterSettings(mode=mode, ratio=keep_ratio)
    groups = group_ids.unique(sorted=True)
    members = [returns[group_ids == g].float() for g in groups]
    stds = torch.stack([m.std(unbiased=False) for m in members])
    means = torch.stack([m.mean() for m in members])
    maxes = torch.stack([m.max() for m in members])
    # RAGEN's score: the sample std (a lone episode's is 0 here, where torch's would be NaN).
    sample_stds = torch.stack(
        [m.double().std() if len(m) > 1 else torch.zeros((), dtype=torch.double) for m in members]
    )
    if strata is None:
        group_strata = torch.zeros(len(groups), dtype=torch.long)
    else:
        labels = [strata[group_ids == g].unique() for g in groups]
        mixed = [int(g) for g, label in zip(groups, labels) if label.numel() > 1]
        if mixed:
            raise ValueError(f"select_groups: groups {mixed} span two strata; a group plays one environment.")
        group_strata = torch.cat(labels)
    kept = torch.zeros(len(groups), dtype=torch.bool)
    for stratum in group_strata.unique(sorted=True):
        inside = torch.nonzero(group_strata == stratum).flatten()
        if settings.mode in RAGEN_STRATEGIES:
            kept[inside[ragen_selection(sample_stds[inside], settings)]] = True
            continue
        # Stable sort on the (possibly negated) std keeps equal-std groups in id order.
        ranked = torch.sort(-stds[inside] if settings.mode == "std" else stds[inside], stable=True).indices
        kept[inside[ranked[: num_kept_groups(len(inside), settings.ratio, settings.mode)]]] = True
    keep = torch.isin(group_ids, groups[kept])

    def kept_mean(values: torch.Tensor) -> float:
        return values[kept].mean().item() if kept.any() else math.nan

    metrics = {
        M.FILTER_REWARD_STD: stds.mean().item(),
        M.FILTER_REWARD_MEAN: means.mean().item(),
        M.FILTER_REWARD_MAX: maxes.mean().item(),
        M.FILTER_KEPT_REWARD_STD: kept_mean(stds),
        M.FILTER_KEPT_REWARD_MEAN: kept_mean(means),
        M.FILTER_KEPT_REWARD_MAX: kept_mean(maxes),
        M.FILTER_KEPT_GROUPS: float(kept.sum()),
        M.FILTER_KEPT_SHARE: float(kept.sum()) / len(groups),
        M.FILTER_ZERO_VARIANCE_GROUPS: float((sample_stds.abs() <= ZERO_SCORE).sum()),
    }
    return keep, metrics
