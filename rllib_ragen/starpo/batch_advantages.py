"""Every estimator's advantages for a learner's batch: the one place where the estimator's inputs are built.

The learner calls :func:`batch_advantages` once per update: before scoring for an estimator without a critic, after
it for one with a critic (whose values the scoring pass computes). The batch is the driver's
(``update_batch.prepare_update_batch``): one row per trajectory, or with a limited context window one per turn,
which :class:`~rllib_ragen.objectives.episode_layout.EpisodeLayout` lays back out as whole episodes, so each
estimator sees the episodes it would see in the full conversation.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
import torch.distributed as dist

from ..objectives import (
    ADVANTAGE_ESTIMATORS,
    ONE_LEARNER,
    AdvantageInputs,
    Shards,
    advantage_recursion_mask,
    compute_advantages,
)
from ..objectives.episode_layout import EpisodeLayout


# What the estimators read of a batch (``turn`` only in turn rows).
BATCH_COLUMNS = (
    "response_mask",
    "token_rewards",
    "episode_return",
    "group",
    "trajectory",
    "turn_rewards",
    "turn_states",
    "turn",
    "role_baseline",
)


def batch_advantages(
    data: Mapping[str, torch.Tensor | np.ndarray],
    config,
    values: torch.Tensor | None = None,
    shards: Shards = ONE_LEARNER,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The configured estimator's (R, T) advantages on the rows' sampled tokens, and the critic's (R, T) targets.

    Args:
        data: the learner's batch columns (see ``prepare_update_batch``): ``response_mask``, ``token_rewards``,
            ``episode_return``, ``group``, ``trajectory``, ``turn_rewards``, ``turn_states``, ``turn`` for turn
            rows, and ``role_baseline`` for ``rae``.
        config: the :class:`~rllib_ragen.starpo.StarPOConfig` (estimator, its settings, ``advantage_mask``).
        values: (R, T) the critic's values, for an estimator that needs them.
        shards: the other data-parallel learners' part of the batch (default: there are none).

    Returns:
        advantages (R, T), zero off the sampled tokens, and the returns (R, T) for a critic estimator (else None).
    """
    columns = {key: torch.as_tensor(data[key]) for key in BATCH_COLUMNS if key in data}
    mask = columns["response_mask"]
    estimator = ADVANTAGE_ESTIMATORS[config.advantage_estimator]
    # A critic's recursion runs over the advantage mask's tokens; an outcome estimator's over the sampled ones.
    recursion_mask = advantage_recursion_mask(mask, config.advantage_mask) if estimator.needs_critic else mask
    turn_rewards, turn_states = _turn_lists(columns["turn_rewards"], columns["turn_states"])
    if "turn" in columns:  # turn rows: each episode's replies end to end, on the CPU where the layout is
        layout = EpisodeLayout(columns["trajectory"].cpu(), columns["turn"].cpu(), recursion_mask.cpu())
        first = layout.first_row.tolist()
        inputs = AdvantageInputs(
            token_rewards=layout.gather(columns["token_rewards"].cpu()),
            response_mask=layout.mask,
            returns=layout.per_episode(columns["episode_return"].cpu()),
            group_ids=layout.per_episode(columns["group"].cpu()),
            values=layout.gather(values.cpu()) if values is not None else None,
            turn_rewards=[turn_rewards[row] for row in first],
            turn_states=[turn_states[row] for row in first],
            baselines=layout.per_episode(columns["role_baseline"].cpu()) if "role_baseline" in columns else None,
            shards=shards,
        )
        advantages, returns = compute_advantages(config.advantage_estimator, inputs, config.advantage_settings())
        back = lambda x: layout.scatter(x).to(mask.device)  # noqa: E731
    else:
        inputs = AdvantageInputs(
            token_rewards=columns["token_rewards"],
            response_mask=recursion_mask,
            returns=columns["episode_return"],
            group_ids=columns["group"],
            values=values,
            turn_rewards=turn_rewards,
            turn_states=turn_states,
            baselines=columns.get("role_baseline"),
            shards=shards,
        )
        # A critic's advantages are whitened over the sampled tokens, not over the recursion's observation steps.
        advantages, returns = compute_advantages(
            config.advantage_estimator,
            inputs,
            config.advantage_settings(),
            whiten_mask=mask if estimator.needs_critic else None,
        )
        back = lambda x: x  # noqa: E731
    return back(advantages) * mask, (back(returns) if returns is not None else None)


def _turn_lists(turn_rewards: torch.Tensor, turn_states: torch.Tensor) -> tuple[list[list[float]], list[list[int]]]:
    """(R, K) padded columns -> per row, each turn's reward and state id (NaN and -1 pad them). The rewards are
    float64, so the lists hold the environment's rewards exactly."""
    reward_counts = (~torch.isnan(turn_rewards)).sum(-1).tolist()
    state_counts = (turn_states >= 0).sum(-1).tolist()
    return (
        [r[:n] for r, n in zip(turn_rewards.cpu().tolist(), reward_counts)],
        [s[:n] for s, n in zip(turn_states.cpu().tolist(), state_counts)],
    )


def process_group_shards(device: torch.device | str) -> Shards:
    """:class:`Shards` over torch's default process group, one shard per rank (RLlib's data-parallel learners).

    The collectives run on ``device`` (NCCL's need CUDA tensors); what they return is on the caller's device.
    ``gather`` needs no agreement on which rank holds which groups: each shard is whole groups in batch order, and
    the batch is in group order, so a stable sort by group of every rank's rows is the batch's own order.
    """
    world = dist.get_world_size()

    def summed(x: torch.Tensor) -> torch.Tensor:
        total = x.to(device).clone()
        dist.all_reduce(total)
        return total.to(x.device)

    def everyone(x: torch.Tensor) -> list[torch.Tensor]:
        sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([len(x)], device=device))
        padded = torch.zeros(int(max(sizes)), dtype=x.dtype, device=device)
        padded[: len(x)] = x.to(device)
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        return [part[: int(size)].to(x.device) for part, size in zip(parts, sizes)]

    def gathered(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        all_values, all_groups = everyone(values), everyone(group_ids)
        rank_of_row = torch.cat([torch.full((len(part),), rank) for rank, part in enumerate(all_values)])
        order = torch.argsort(torch.cat(all_groups).cpu(), stable=True)
        mine = torch.nonzero(rank_of_row[order] == dist.get_rank()).flatten()
        return torch.cat(all_values)[order.to(values.device)], mine.to(values.device)

    return Shards(sum=summed, gather=gathered)
