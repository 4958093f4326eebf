"""StarPO-S uncertainty-based rollout filtering: train on the groups whose outcomes vary most."""

from __future__ import annotations

import math

import torch

FILTER_MODES = ("std", "reversed_std", "none")


def select_groups(returns: torch.Tensor, group_ids: torch.Tensor, keep_ratio: float = 0.25,
                  mode: str = "std") -> tuple[torch.Tensor, dict[str, float]]:
    """Keep the ``ceil(keep_ratio * G)`` groups ranked by the within-group std of trajectory returns.

    ``std`` keeps the most uncertain groups (StarPO-S, arXiv 2504.20073 sec. 4.2: top 25% by default);
    ``reversed_std`` keeps the least uncertain ones (an ablation); ``none`` keeps everything. Ties break by
    lower group id, so the choice is deterministic.

    Args:
        returns: (B,) trajectory returns.
        group_ids: (B,) group of each trajectory.
        keep_ratio: share of groups kept, in (0, 1].
        mode: one of ``FILTER_MODES``.

    Returns:
        keep (B,) bool mask of kept trajectories, and metrics on reward std/mean/max over all and kept groups.
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"filter mode {mode!r}: choose one of {FILTER_MODES}.")
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio={keep_ratio} must lie in (0, 1].")
    groups = group_ids.unique(sorted=True)
    stds = torch.stack([returns[group_ids == g].float().std(unbiased=False) for g in groups])
    means = torch.stack([returns[group_ids == g].float().mean() for g in groups])
    maxes = torch.stack([returns[group_ids == g].float().max() for g in groups])
    num_keep = len(groups) if mode == "none" else max(1, math.ceil(keep_ratio * len(groups) - 1e-9))
    # Stable sort on the (possibly negated) std keeps equal-std groups in id order.
    order = torch.sort(-stds if mode == "std" else stds, stable=True).indices
    kept_groups = groups[order[:num_keep]]
    keep = torch.isin(group_ids, kept_groups)
    kept = torch.isin(groups, kept_groups)
    metrics = {
        "rollout_filter/reward_std": stds.mean().item(), "rollout_filter/reward_mean": means.mean().item(),
        "rollout_filter/reward_max": maxes.mean().item(), "rollout_filter/kept_reward_std": stds[kept].mean().item(),
        "rollout_filter/kept_reward_mean": means[kept].mean().item(),
        "rollout_filter/kept_reward_max": maxes[kept].mean().item(), "rollout_filter/kept_groups": float(num_keep),
    }
    return keep, metrics
