"""From trajectories to the learner's padded batch: rewards on tokens and trajectory-level advantages.

Runs on the driver. GAE needs critic values and is finished on the learner; GRPO/BRPO/raw advantages are one
number per trajectory and are computed here, after the rollout filter (a kept group is always kept whole).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..objectives import compute_batch_advantages, compute_group_advantages, place_rewards
from ..rollout.engine import Trajectory

ADVANTAGE_ESTIMATORS = ("gae", "grpo", "brpo", "raw")


def trajectory_advantages(trajectories: Sequence[Trajectory], estimator: str,
                          normalize_std: bool = True) -> np.ndarray:
    """One advantage per trajectory for ``grpo`` (per group), ``brpo`` (over the batch) and ``raw`` (the return).

    ``gae`` gets zeros here: its token advantages come from the critic on the learner.
    """
    returns = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)
    if estimator == "grpo":
        groups = torch.tensor([t.group for t in trajectories])
        return compute_group_advantages(returns, groups, normalize_std=normalize_std).numpy()
    if estimator == "brpo":
        return compute_batch_advantages(returns, normalize_std=normalize_std).numpy()
    if estimator == "raw":
        return returns.numpy()
    if estimator == "gae":
        return np.zeros(len(trajectories), dtype=np.float32)
    raise ValueError(f"advantage_estimator={estimator!r}: choose one of {ADVANTAGE_ESTIMATORS}.")


def build_train_batch(trajectories: Sequence[Trajectory], advantages: np.ndarray, pad_token_id: int,
                      turn_level_rewards: bool = False) -> dict[str, np.ndarray]:
    """Right-padded (B, T) columns for the learner.

    Columns: ``input_ids``, ``attention_mask``, ``response_mask`` (1 on sampled tokens), ``behaviour_logprobs``,
    ``token_rewards`` (the return on the last sampled token, or each turn's reward on its own last token with
    ``turn_level_rewards``), ``advantages`` (B,) and ``group`` (B,).
    """
    batch_size, width = len(trajectories), max(len(t.token_ids) for t in trajectories)
    input_ids = np.full((batch_size, width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((batch_size, width), dtype=np.int64)
    response_mask = np.zeros((batch_size, width), dtype=np.float32)
    behaviour_logprobs = np.zeros((batch_size, width), dtype=np.float32)
    for row, t in enumerate(trajectories):
        n = len(t.token_ids)
        input_ids[row, :n] = t.token_ids
        attention_mask[row, :n] = 1
        response_mask[row, :n] = t.response_mask
        behaviour_logprobs[row, :n] = t.behaviour_logprobs
    rewards = place_rewards([[end - 1 for _, end in t.turn_spans] for t in trajectories],
                            [t.turn_rewards for t in trajectories], (batch_size, width), per_turn=turn_level_rewards)
    return {
        "input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask,
        "behaviour_logprobs": behaviour_logprobs, "token_rewards": rewards.numpy(),
        "advantages": np.asarray(advantages, dtype=np.float32),
        "group": np.array([t.group for t in trajectories], dtype=np.int64),
    }
