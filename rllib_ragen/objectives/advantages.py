"""Advantage estimators for multi-turn trajectories, as pure functions on padded tensors, and their table.

Shapes: B trajectories, T token positions. ``response_mask`` (B, T) is 1 on tokens the policy sampled. Rewards
sit on response tokens (the last token of a turn or of the trajectory); observation tokens carry nothing.

``ADVANTAGE_ESTIMATORS`` maps each name ``StarPOConfig.training(advantage_estimator=...)`` accepts to an
:class:`AdvantageEstimator`: one function with one signature, ``fn(inputs, settings) -> (advantages, returns)``,
and whether it needs the critic. Estimators without a critic (outcome estimators: one number per trajectory) run
on the driver right after the rollout filter; estimators with one run on the learner, where the critic's values
are. Add your own with :func:`register_advantage_estimator`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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


# ---- the estimator table -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read; every tensor is zero off ``response_mask``.

    Attributes:
        token_rewards: (B, T) rewards on response tokens (see :func:`place_rewards`).
        response_mask: (B, T) 1 on tokens the policy sampled.
        returns: (B,) each trajectory's return (the sum of its turn rewards).
        group_ids: (B,) the group (shared initial state) of each trajectory.
        values: (B, T) the critic's values, or None where no critic exists (the driver).
    """

    token_rewards: torch.Tensor
    response_mask: torch.Tensor
    returns: torch.Tensor
    group_ids: torch.Tensor
    values: torch.Tensor | None = None


@dataclass(frozen=True)
class AdvantageSettings:
    """The estimator knobs of ``StarPOConfig``: ``gamma``, ``lambda_`` and ``grpo_normalize_std``."""

    gamma: float = 1.0
    lam: float = 1.0
    normalize_std: bool = True


EstimatorFn = Callable[[AdvantageInputs, AdvantageSettings], "tuple[torch.Tensor, torch.Tensor | None]"]


@dataclass(frozen=True)
class AdvantageEstimator:
    """An entry of ``ADVANTAGE_ESTIMATORS``.

    Attributes:
        fn: ``fn(inputs, settings) -> (advantages (B, T), returns (B, T) or None)``; the returns are the
            critic's targets and are needed only when ``needs_critic``.
        needs_critic: True builds a critic, and the estimator runs on the learner with ``inputs.values`` set.
    """

    fn: EstimatorFn
    needs_critic: bool


def _outcome(per_trajectory: torch.Tensor, inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """One advantage per trajectory (B,), given to each of its response tokens (B, T)."""
    mask = inputs.response_mask.float()
    return per_trajectory[:, None].float() * mask, None


def _gae(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_gae(inputs.token_rewards, inputs.values, inputs.response_mask, settings.gamma, settings.lam)


def _grpo(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, None]:
    return _outcome(compute_group_advantages(inputs.returns, inputs.group_ids, settings.normalize_std), inputs)


def _brpo(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, None]:
    return _outcome(compute_batch_advantages(inputs.returns, settings.normalize_std), inputs)


def _raw(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, None]:
    return _outcome(inputs.returns, inputs)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": AdvantageEstimator(_gae, needs_critic=True),  # PPO with a critic: StarPO-S
    "grpo": AdvantageEstimator(_grpo, needs_critic=False),  # the return against its group's
    "brpo": AdvantageEstimator(_brpo, needs_critic=False),  # the return against the whole batch's
    "raw": AdvantageEstimator(_raw, needs_critic=False),  # the return itself
}


def register_advantage_estimator(name: str, fn: EstimatorFn, *, needs_critic: bool = False) -> None:
    """Make ``advantage_estimator=name`` select ``fn``.

    Register in a module every process imports (the driver, remote env runners and learners), as you would a
    gymnasium environment: an estimator with ``needs_critic`` runs on the learners.

    Args:
        name: the new name; the built-in ones cannot be replaced.
        fn: ``fn(inputs: AdvantageInputs, settings: AdvantageSettings) -> (advantages, returns or None)``.
        needs_critic: whether ``fn`` reads ``inputs.values`` (and returns the critic's targets).
    """
    if name in ("gae", "grpo", "brpo", "raw"):
        raise ValueError(f"advantage estimator {name!r} is built in; register yours under another name.")
    ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(fn, needs_critic)


def compute_advantages(name: str, inputs: AdvantageInputs,
                       settings: AdvantageSettings) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the estimator registered as ``name``; (advantages (B, T), returns (B, T) or None)."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise KeyError(f"advantage estimator {name!r}: choose one of {sorted(ADVANTAGE_ESTIMATORS)}.")
    estimator = ADVANTAGE_ESTIMATORS[name]
    if estimator.needs_critic and inputs.values is None:
        raise ValueError(f"advantage estimator {name!r} needs the critic's values; it runs on the learner.")
    return estimator.fn(inputs, settings)
