"""Advantage estimators for multi-turn trajectories, as pure functions on padded tensors.

Shapes: B trajectories, T token positions. ``response_mask`` (B, T) is 1 on tokens the policy sampled. Rewards
sit on response tokens (the last token of a turn or of the trajectory); observation tokens carry nothing.
"""

from __future__ import annotations

import torch


def place_rewards(turn_end_positions: list[list[int]], turn_rewards: list[list[float]], shape: tuple[int, int],
                  per_turn: bool = False) -> torch.Tensor:
    """Token-level reward tensor from per-turn rewards.

    ``per_turn=False`` (StarPO): the trajectory's return, sum_k r_k, on its last sampled token.
    ``per_turn=True`` (turn-level credit, TRICO): r_k on the last sampled token of turn k.

    Args:
        turn_end_positions: per trajectory, the index of each turn's last sampled token.
        turn_rewards: per trajectory, each turn's reward.
        shape: (B, T).

    Returns:
        rewards (B, T), zero everywhere else.
    """
    rewards = torch.zeros(shape)
    for row, (ends, values) in enumerate(zip(turn_end_positions, turn_rewards)):
        if not ends:
            continue
        if per_turn:
            for end, value in zip(ends, values):
                rewards[row, end] += value
        else:
            rewards[row, ends[-1]] = float(sum(values))
    return rewards


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0,
                lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the policy's own tokens only.

    delta_t = r_t + gamma * V(next) - V(t);  A_t = delta_t + gamma * lam * A(next)   (arXiv 1506.02438, eqn. 16)

    "next" is the next *response* token: observation and padding tokens are skipped inside the recursion itself,
    so values and advantages carry across them (a turn's last token bootstraps from the next turn's first
    token). With gamma = lam = 1 this reduces to A_t = (sum of rewards from t on) - V(t).

    Args:
        rewards: (B, T) token rewards.
        values: (B, T) critic values; read on response tokens only.
        response_mask: (B, T) 1 on tokens the policy sampled.

    Returns:
        advantages (B, T) and returns = advantages + values (B, T), zero off the mask.
    """
    mask = response_mask.float()
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    next_value = torch.zeros(rewards.shape[0])
    next_advantage = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage * m
        # Only a response token becomes the "next" of earlier tokens; other positions leave the carry unchanged.
        next_value = torch.where(m > 0, values[:, t].float(), next_value)
        next_advantage = torch.where(m > 0, advantage, next_advantage)
    return advantages, (advantages + values) * mask


def compute_group_advantages(returns: torch.Tensor, group_ids: torch.Tensor, normalize_std: bool = True,
                             eps: float = 1e-6) -> torch.Tensor:
    """GRPO: each trajectory's return relative to its group (same initial state).

    A_i = (R_i - mean_g(R)) / (std_g(R) + eps) with ``normalize_std``, else R_i - mean_g(R)
    (arXiv 2402.03300, sec. 4.1.2). A group whose returns are all equal gets zero advantages.

    Dividing by the std amplifies tiny differences in nearly-uniform groups; on the risky bandit this teaches the
    wrong arm, so mean-only (``normalize_std=False``) is offered too.

    Args:
        returns: (B,) trajectory returns.
        group_ids: (B,) integer group of each trajectory.

    Returns:
        advantages (B,), to be broadcast over each trajectory's response tokens.
    """
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    for group in group_ids.unique():
        members = group_ids == group
        centred = returns[members].float() - returns[members].float().mean()
        if normalize_std and members.sum() > 1:
            std = returns[members].float().std()
            centred = torch.zeros_like(centred) if std < eps else centred / (std + eps)
        advantages[members] = centred
    return advantages


def compute_batch_advantages(returns: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """BRPO: the GRPO normalisation over the whole batch instead of per group. Returns (B,)."""
    return compute_group_advantages(returns, torch.zeros_like(returns, dtype=torch.long), normalize_std, eps)
