"""From a rollout to the learner's batch: the rollout filter, outcome advantages, rewards on tokens, padding.

Runs on the driver, once per training step. Estimators that need the critic (``gae``) are computed on the
learner, where the values are; the others (``grpo``, ``gigpo``, ``brpo``, ``raw``, and any registered without a
critic) are computed here, on the kept groups, each of which is kept whole.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .. import metrics as M
from ..objectives import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantages, place_rewards, select_groups
from ..rollout.engine import Trajectory, pad_trajectories
from ..rollout.protocol import LOSS_MASK_REGIONS, REGION_OTHER


def prepare_update_batch(trajectories: Sequence[Trajectory], config, pad_token_id: int,
                         keep_ratio: float | None = None) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The learner's batch from one rollout.

    Args:
        trajectories: the rollout, group ids 0..P-1.
        config: the :class:`~rllib_ragen.starpo.StarPOConfig` (filter, estimator and reward settings).
        pad_token_id: the tokenizer's padding id.
        keep_ratio: the rollout filter's share of groups kept, when a sentinel rollback changed it (None: the
            config's ``rollout_filter_ratio``).

    Returns:
        Right-padded (B, T) columns of the kept trajectories, in group order: ``input_ids``, ``attention_mask``,
        ``response_mask`` (1 on sampled tokens), ``behaviour_logprobs``, ``token_rewards`` (the return on the
        last sampled token, or each turn's reward on its own last token with ``turn_level_rewards``),
        ``advantages`` (B, T) for estimators without a critic, ``loss_mask`` (B, T: the sampled tokens the policy
        loss trains, by ``config.loss_mask``) and ``group`` (B,). Plus the filter's metrics.
    """
    returns = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)
    groups = torch.tensor([t.group for t in trajectories])
    ratio = config.rollout_filter_ratio if keep_ratio is None else keep_ratio
    env_index = {name: i for i, name in enumerate(dict.fromkeys(t.env_name for t in trajectories))}
    envs = torch.tensor([env_index[t.env_name] for t in trajectories])
    strata = envs if config.rollout_filter_per_env else None
    keep, metrics = select_groups(returns, groups, ratio, config.rollout_filter, strata=strata)
    if config.is_mixture:  # what each training environment kept: with one filter over all, it can be none
        for name, i in env_index.items():
            metrics[f"{M.FILTER_KEPT_GROUPS}/{name}"] = float(groups[keep & (envs == i)].unique().numel())
    order = torch.tensor(sorted(np.flatnonzero(keep.numpy()).tolist(), key=lambda i: trajectories[i].group),
                         dtype=torch.long)  # group order; a stable sort keeps the rollout's order within a group
    kept = [trajectories[i] for i in order.tolist()]

    columns = pad_trajectories(kept, pad_token_id)
    shape = columns["input_ids"].shape
    rewards = place_rewards([[end - 1 for _, end in t.turn_spans] for t in kept], [t.turn_rewards for t in kept],
                            shape, per_turn=config.turn_level_rewards)
    columns["token_rewards"] = rewards.numpy()
    columns["loss_mask"] = _loss_mask(kept, columns["response_mask"], config.loss_mask)
    columns["group"] = np.array([t.group for t in kept], dtype=np.int64)
    if not ADVANTAGE_ESTIMATORS[config.advantage_estimator].needs_critic:
        inputs = AdvantageInputs(token_rewards=rewards, response_mask=torch.from_numpy(columns["response_mask"]),
                                 returns=returns[order], group_ids=groups[order],
                                 turn_rewards=[t.turn_rewards for t in kept], turn_states=[t.turn_states for t in kept])
        advantages, _ = compute_advantages(config.advantage_estimator, inputs, config.advantage_settings())
        columns["advantages"] = advantages.numpy().astype(np.float32)
    metrics[M.KEPT_TRAJECTORIES] = float(len(kept))
    metrics[M.RESPONSE_LENGTH] = float(columns["response_mask"].sum(-1).mean())
    return columns, metrics


def _loss_mask(kept: Sequence[Trajectory], response_mask: np.ndarray, mode: str) -> np.ndarray:
    """(B, T) float32: the sampled tokens ``loss_mask`` trains, by the reply region each one belongs to."""
    regions = np.full(response_mask.shape, REGION_OTHER, dtype=np.int64)
    for row, t in enumerate(kept):
        regions[row, :len(t.token_regions)] = t.token_regions
    return response_mask * np.isin(regions, LOSS_MASK_REGIONS[mode]).astype(np.float32)


def shard_by_groups(columns: dict[str, np.ndarray], num_shards: int) -> list[dict[str, np.ndarray]]:
    """Split a batch into ``num_shards`` row blocks at group boundaries, as equal in groups as they can be.

    One shard per remote learner: a group never straddles two learners.
    """
    group_ids = np.unique(columns["group"])
    shards = []
    for chunk in np.array_split(group_ids, num_shards):
        rows = np.isin(columns["group"], chunk)
        shards.append({key: value[rows] for key, value in columns.items()})
    return shards
