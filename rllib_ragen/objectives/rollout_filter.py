"""StarPO-S uncertainty-based rollout filtering: train on the groups whose outcomes vary most."""

from __future__ import annotations

import math

import torch

from .. import metrics as M

FILTER_MODES = ("std", "reversed_std", "none")


def num_kept_groups(num_groups: int, keep_ratio: float, mode: str = "std") -> int:
    """How many of ``num_groups`` groups the filter keeps: ``ceil(keep_ratio * num_groups)``, at least one.

    The reference keeps ``int(ratio * groups)``, which can be 0; the ceiling never empties a batch. ``none``
    keeps every group whatever the ratio. The 1e-9 absorbs float error (0.3 * 10 = 3.0000000000000004).
    """
    if mode == "none":
        return num_groups
    return max(1, math.ceil(keep_ratio * num_groups - 1e-9))


def select_groups(returns: torch.Tensor, group_ids: torch.Tensor, keep_ratio: float = 0.25,
                  mode: str = "std", strata: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Keep the :func:`num_kept_groups` groups ranked by the within-group std of trajectory returns.

    ``std`` keeps the most uncertain groups (StarPO-S, arXiv 2504.20073 sec. 4.2: top 25% by default);
    ``reversed_std`` keeps the least uncertain ones (an ablation); ``none`` keeps everything. Ties break by
    lower group id, so the choice is deterministic. ``StarPOConfig.validate`` checks ``keep_ratio`` and ``mode``.

    Args:
        returns: (B,) trajectory returns.
        group_ids: (B,) group of each trajectory.
        keep_ratio: share of groups kept, in (0, 1].
        mode: one of ``FILTER_MODES``.
        strata: (B,) optional label of each trajectory (its training environment, all of a group's the same):
            groups are then ranked and kept within each stratum, ``num_kept_groups`` of each stratum's groups.

    Returns:
        keep (B,) bool mask of kept trajectories, and metrics on reward std/mean/max over all and kept groups.
    """
    groups = group_ids.unique(sorted=True)
    stds = torch.stack([returns[group_ids == g].float().std(unbiased=False) for g in groups])
    means = torch.stack([returns[group_ids == g].float().mean() for g in groups])
    maxes = torch.stack([returns[group_ids == g].float().max() for g in groups])
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
        members = torch.nonzero(group_strata == stratum).flatten()
        # Stable sort on the (possibly negated) std keeps equal-std groups in id order.
        ranked = torch.sort(-stds[members] if mode == "std" else stds[members], stable=True).indices
        kept[members[ranked[:num_kept_groups(len(members), keep_ratio, mode)]]] = True
    num_keep = int(kept.sum())
    keep = torch.isin(group_ids, groups[kept])
    metrics = {
        M.FILTER_REWARD_STD: stds.mean().item(), M.FILTER_REWARD_MEAN: means.mean().item(),
        M.FILTER_REWARD_MAX: maxes.mean().item(), M.FILTER_KEPT_REWARD_STD: stds[kept].mean().item(),
        M.FILTER_KEPT_REWARD_MEAN: means[kept].mean().item(), M.FILTER_KEPT_REWARD_MAX: maxes[kept].mean().item(),
        M.FILTER_KEPT_GROUPS: float(num_keep),
    }
    return keep, metrics
