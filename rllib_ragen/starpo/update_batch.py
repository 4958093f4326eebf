"""From a rollout to the learner's batch: the rollout filter, rewards on tokens, the loss mask, padding.

Runs on the driver, once per training step. The advantages are the learner's (``batch_advantages.py``): the batch
carries what every estimator reads, and the filter keeps each group whole.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .. import metrics as M
from ..objectives import RoleBaselines, place_rewards, select_groups
from ..rollout.trajectory import Trajectory, pad_trajectories
from ..rollout.protocol import LOSS_MASK_REGIONS, REGION_OTHER


def trajectory_role(trajectory: Trajectory) -> str:
    """The role RAE's baseline is kept for: the training environment, and the seat in a multi-agent game."""
    return trajectory.env_name if trajectory.seat is None else f"{trajectory.env_name}/{trajectory.seat}"


def prepare_update_batch(
    trajectories: Sequence[Trajectory],
    config,
    pad_token_id: int,
    keep_ratio: float | None = None,
    role_baselines: RoleBaselines | None = None,
) -> tuple[dict[str, np.ndarray] | None, dict[str, float]]:
    """The learner's batch from one rollout.

    Args:
        trajectories: the rollout, group ids 0..P-1.
        config: the :class:`~rllib_ragen.starpo.StarPOConfig` (filter, estimator, reward and context settings).
        pad_token_id: the tokenizer's padding id.
        keep_ratio: the rollout filter's share of groups kept, when a sentinel rollback changed it (None: the
            config's ``rollout_filter_ratio``).
        role_baselines: ``rae``'s running baselines: every trajectory of the rollout, kept or not, moves its role's
            (in group order), and each row carries its trajectory's baseline from before (``role_baseline``).

    Returns:
        None when the filter kept no group, else right-padded (R, T) columns of the kept trajectories' rows, in
        group order: one row per trajectory, or with a limited ``context_window`` one per turn (in turn order).
        ``input_ids``, ``attention_mask``, ``response_mask`` (1 on sampled tokens), ``behaviour_logprobs``,
        ``token_rewards`` (the return on the trajectory's last sampled token, or each turn's reward on its own last
        token with ``turn_level_rewards``), ``loss_mask`` (R, T: the sampled tokens the policy loss trains, by
        ``config.loss_mask``), per row ``group``, ``trajectory`` (its index in ``trajectories``),
        ``episode_return``, and its episode's ``turn_rewards`` (R, K, float64, NaN past the last turn) and
        ``turn_states`` (R, K: an id per distinct state key, -1 past the last), plus ``turn`` with a window and
        ``role_baseline`` with ``role_baselines``. Plus the filter's metrics (and the roles' baselines).
    """
    returns = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)
    groups = torch.tensor([t.group for t in trajectories])
    env_index = {name: i for i, name in enumerate(dict.fromkeys(t.env_name for t in trajectories))}
    envs = torch.tensor([env_index[t.env_name] for t in trajectories])
    strata = envs if config.rollout_filter_per_env else None
    keep, metrics = select_groups(returns, groups, strata=strata, settings=config.filter_settings(keep_ratio))
    if role_baselines is not None:
        in_order = sorted(range(len(trajectories)), key=lambda i: trajectories[i].group)
        roles = [trajectory_role(trajectories[i]) for i in in_order]
        before = role_baselines.advance([trajectories[i].total_return for i in in_order], roles)
        baseline_of = dict(zip(in_order, before))
        metrics.update({f"{M.ROLE_BASELINE}/{role}": value for role, value in role_baselines.values.items()})
    if config.is_mixture:  # what each training environment kept: with one filter over all, it can be none
        for name, i in env_index.items():
            metrics[f"{M.FILTER_KEPT_GROUPS}/{name}"] = float(groups[keep & (envs == i)].unique().numel())
    metrics[M.KEPT_TRAJECTORIES] = float(keep.sum())
    if not keep.any():
        return None, metrics
    # Group order; a stable sort keeps the rollout's order within a group.
    order = sorted(np.flatnonzero(keep.numpy()).tolist(), key=lambda i: trajectories[i].group)
    kept = [trajectories[i] for i in order]
    windowed = config.context_window != "full"
    rows = [
        (i, k if windowed else None, row)
        for i, t in zip(order, kept)
        for k, row in enumerate(t.rows if windowed else [t])
    ]

    columns = pad_trajectories([row for _, _, row in rows], pad_token_id)
    shape = columns["input_ids"].shape
    if windowed:  # each row's reply is one turn: its reward (or, on the last turn, the return) on its last token
        ends = [[row.reply_span[1] - 1] for _, _, row in rows]
        values = [
            [
                trajectories[i].turn_rewards[k]
                if config.turn_level_rewards
                else (trajectories[i].total_return if k == trajectories[i].num_turns - 1 else 0.0)
            ]
            for i, k, _ in rows
        ]
        rewards = place_rewards(ends, values, shape, per_turn=True)
    else:
        rewards = place_rewards(
            [[end - 1 for _, end in t.turn_spans] for t in kept],
            [t.turn_rewards for t in kept],
            shape,
            per_turn=config.turn_level_rewards,
        )
    columns["token_rewards"] = rewards.numpy()
    columns["loss_mask"] = _loss_mask([row for _, _, row in rows], columns["response_mask"], config.loss_mask)
    columns["group"] = np.array([trajectories[i].group for i, _, _ in rows], dtype=np.int64)
    columns["trajectory"] = np.array([i for i, _, _ in rows], dtype=np.int64)
    columns["episode_return"] = np.array([trajectories[i].total_return for i, _, _ in rows], dtype=np.float32)
    if windowed:
        columns["turn"] = np.array([k for _, k, _ in rows], dtype=np.int64)
    if role_baselines is not None:
        columns["role_baseline"] = np.array([baseline_of[i] for i, _, _ in rows], dtype=np.float32)
    columns["turn_rewards"], columns["turn_states"] = _turn_columns([trajectories[i] for i, _, _ in rows])
    metrics[M.TRAINING_ROWS] = float(len(rows))
    metrics[M.RESPONSE_LENGTH] = float(columns["response_mask"].sum() / len(kept))
    return columns, metrics


def _turn_columns(trajectories: Sequence[Trajectory]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's episode: its turn rewards (R, K) float64, exactly the environment's (NaN past the last turn: an
    environment's NaN reward drops its episode), and its state keys (R, K) as ids equal where the keys are (GiGPO's
    anchor states), -1 past the last."""
    width = max(max(len(t.turn_rewards), len(t.turn_states)) for t in trajectories)
    rewards = np.full((len(trajectories), width), np.nan)
    states = np.full((len(trajectories), width), -1, dtype=np.int64)
    ids: dict = {}
    for row, t in enumerate(trajectories):
        rewards[row, : len(t.turn_rewards)] = t.turn_rewards
        states[row, : len(t.turn_states)] = [ids.setdefault(key, len(ids)) for key in t.turn_states]
    return rewards, states


def token_advantages_by_trajectory(
    columns: dict, advantages: np.ndarray, trajectories: Sequence[Trajectory]
) -> dict[int, list[float]]:
    """(R, T) row advantages -> per kept trajectory (by index), one per token of its whole conversation (the
    viewer's layout): a windowed row's reply goes to its turn's span."""
    result = {int(i): [0.0] * len(trajectories[i].token_ids) for i in np.unique(columns["trajectory"])}
    for row, i in enumerate(columns["trajectory"].tolist()):
        t = trajectories[i]
        if "turn" in columns:
            start, end = t.turn_spans[int(columns["turn"][row])]
            reply_start = t.turn_samples[int(columns["turn"][row])].reply_span[0]
            result[i][start:end] = advantages[row, reply_start : reply_start + end - start].tolist()
        else:
            result[i] = advantages[row, : len(t.token_ids)].tolist()
    return result


def _loss_mask(kept: Sequence, response_mask: np.ndarray, mode: str) -> np.ndarray:
    """(B, T) float32: the sampled tokens ``loss_mask`` trains, by the reply region each one belongs to."""
    regions = np.full(response_mask.shape, REGION_OTHER, dtype=np.int64)
    for row, t in enumerate(kept):
        regions[row, : len(t.token_regions)] = t.token_regions
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
