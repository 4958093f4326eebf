"""Advantage estimators for multi-turn trajectories, as pure functions on padded tensors (their table, by name:
``estimators.py``).

Shapes: B trajectories, T token positions. ``response_mask`` (B, T) is 1 on tokens the policy sampled. Rewards
sit on response tokens (the last token of a turn or of the trajectory); observation tokens carry nothing.
"""

from __future__ import annotations

from typing import Callable

import torch


def place_rewards(
    turn_end_positions: list[list[int]], turn_rewards: list[list[float]], shape: tuple[int, int], per_turn: bool = False
) -> torch.Tensor:
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


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
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
    mask = response_mask > 0
    delta = rewards.float() + gamma * _next_masked(values.float(), mask) - values.float()
    # Off the mask the carry passes through unchanged (factor 1, nothing added): observation tokens are skipped.
    advantages = _reverse_linear_recurrence(torch.where(mask, delta, 0.0), torch.where(mask, gamma * lam, 1.0)) * mask
    return advantages, (advantages + values) * mask


def _next_masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T): at each position, ``x`` at the next *later* position where ``mask`` is set; 0 where there is none."""
    width = x.shape[1]
    positions = torch.where(mask, torch.arange(width, device=x.device), width)
    first_from = positions.flip(-1).cummin(-1).values.flip(-1)  # smallest masked position >= t
    after = torch.nn.functional.pad(first_from[:, 1:], (0, 1), value=width)  # ... > t
    return torch.nn.functional.pad(x, (0, 1)).gather(1, after)


def _reverse_linear_recurrence(a: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x_t = a_t + k_t x_{t+1} along the last dimension, x_T = 0: every GAE-style recursion, one fused multiply-add
    per position (the tensors are walked column by column in (T, B) layout)."""
    a_t, k_t = a.T.contiguous(), k.T.contiguous()
    out = torch.empty_like(a_t)
    carry = torch.zeros_like(a_t[0])
    for t in range(a_t.shape[0] - 1, -1, -1):
        carry = torch.addcmul(a_t[t], k_t[t], carry, out=out[t])
    return out.T


def turn_end_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the last position of each contiguous run of ``response_mask == 1``, i.e. each turn's last
    sampled token (where :func:`place_rewards` puts turn rewards)."""
    mask = response_mask > 0
    after = torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)
    return mask & ~after


# Which tokens the critic estimators' recursion steps through (StarPOConfig.advantage_mask), VAGEN's "GAE mask".
ADVANTAGE_MASKS = (
    "sampled",  # the policy's own tokens only: observation tokens are skipped (RAGEN's)
    "sampled_and_observations",  # every token from the first sampled one to the last: observations are steps too
)


def advantage_recursion_mask(response_mask: torch.Tensor, mode: str = "sampled") -> torch.Tensor:
    """(B, T) float: the tokens the advantage recursion runs over (``ADVANTAGE_MASKS``).

    ``"sampled_and_observations"`` adds the environment's tokens between a trajectory's first and last sampled
    token: each is a step with no reward, so with gamma * lambda < 1 credit fades across long observations. The
    first prompt and the padding are never steps.
    """
    if mode not in ADVANTAGE_MASKS:
        raise ValueError(f"advantage mask {mode!r}: choose one of {ADVANTAGE_MASKS}.")
    mask = response_mask > 0
    if mode == "sampled":
        return mask.to(response_mask.dtype)
    started = mask.long().cumsum(-1) > 0
    not_over = mask.flip(-1).long().cumsum(-1).flip(-1) > 0
    return (started & not_over).to(response_mask.dtype)


def turn_index(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) long: the turn (0, 1, ...) each sampled token belongs to, -1 off the mask."""
    mask = response_mask > 0
    before = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    starts = (mask & ~before).long()
    return torch.where(mask, starts.cumsum(-1) - 1, torch.full_like(starts, -1))


def _turn_level_gae(
    rewards: torch.Tensor, values: torch.Tensor, ends: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over turns, read at the turn-end tokens: delta_k = r_k + gamma V(e_{k+1}) - V(e_k),
    A_k = delta_k + gamma lam A_{k+1}. All (B, T); the advantages and the returns (A_k + V(e_k)) sit on the
    turn-end positions, zero elsewhere."""
    delta = rewards.float() + gamma * _next_masked(values.float(), ends) - values.float()
    advantages = _reverse_linear_recurrence(torch.where(ends, delta, 0.0), torch.where(ends, gamma * lam, 1.0))
    advantages = advantages * ends
    return advantages, (advantages + values.float()) * ends


def compute_bi_level_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma_turn: float = 0.95,
    gamma_token: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRICO's bi-level GAE (VAGEN): turn-level credit across turns, token-level credit inside each turn.

    Turn ends e_k are the last positions of the contiguous runs of ``response_mask == 1``; rewards sit there.

    1. Turn level, over the turn ends: delta_k = r_k + gamma_turn V(e_{k+1}) - V(e_k) (V(e_{K+1}) = 0),
       A_k = delta_k + gamma_turn lam A_{k+1}, and the turn's return G_k = A_k + V(e_k).
    2. Token level, inside turn k, backwards from its end: the end token takes G_k as its reward with nothing
       after it (no bootstrapping past a turn's end), A(e_k) = G_k - V(e_k); each earlier token t of the turn has
       delta_t = r_t + gamma_token V(t + 1) - V(t), A_t = delta_t + gamma_token lam A_{t+1}.

    With gamma_turn = gamma_token = lam = 1 this is :func:`compute_gae` with gamma = lam = 1 on per-turn rewards.
    Unlike VAGEN's implementation, a turn whose reward is exactly 0 is still a turn (it finds turn ends
    from the mask, not from non-zero rewards).

    Args:
        rewards: (B, T), non-zero only on turn ends.
        values: (B, T) critic values; read on response tokens only.
        response_mask: (B, T) 1 on tokens the policy sampled.

    Returns:
        advantages (B, T) and returns = advantages + values (B, T), zero off the mask, before any whitening.
    """
    mask, ends = response_mask > 0, turn_end_mask(response_mask)
    r, v = rewards.float(), values.float()
    _, turn_returns = _turn_level_gae(r, v, ends, gamma_turn, lam)
    # A turn is a contiguous run: the next token of a non-end token is t + 1, in the same turn.
    next_value = torch.nn.functional.pad(v[:, 1:], (0, 1))
    delta = torch.where(ends, turn_returns - v, r + gamma_token * next_value - v)
    inside = mask & ~ends  # the only positions whose advantage continues from the next one
    advantages = (
        _reverse_linear_recurrence(torch.where(mask, delta, 0.0), torch.where(inside, gamma_token * lam, 0.0)) * mask
    )
    return advantages, (advantages + v) * mask


def compute_turn_gae(
    rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float = 0.95, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """One GAE advantage per turn: the turn-level recursion of :func:`compute_bi_level_gae` over the turn-end values,
    A_k given to every token of turn k, and G_k = A_k + V(e_k) as every one of its tokens' return.

    Returns:
        advantages (B, T) and returns (B, T), constant within each turn, zero off the mask.
    """
    turn_advantages, turn_returns = _turn_level_gae(rewards, values, turn_end_mask(response_mask), gamma, lam)
    return _spread_over_turns(turn_advantages, response_mask), _spread_over_turns(turn_returns, response_mask)


def _spread_over_turns(at_turn_ends: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) values sitting on turn ends -> the same value on every sampled token of that turn."""
    index = turn_index(response_mask)
    ends = turn_end_mask(response_mask)
    per_turn = torch.zeros(
        response_mask.shape[0], int(index.max().item()) + 1 if index.numel() else 0, device=at_turn_ends.device
    )
    rows, cols = ends.nonzero(as_tuple=True)
    per_turn[rows, index[rows, cols]] = at_turn_ends[rows, cols].float()
    return turn_values_on_tokens(per_turn, index)


def turn_values_on_tokens(per_turn: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, K) one value per turn -> (B, T) that value on every token of the turn (``index``: :func:`turn_index`),
    zero off the mask."""
    padded = torch.nn.functional.pad(per_turn, (0, 1))  # a column for the -1 of tokens outside every turn
    return torch.where(index >= 0, padded.gather(1, index.clamp(min=0)), 0.0)


def compute_gigpo_step_advantages(
    turn_rewards: list[list[float]],
    turn_states: list[list[str]],
    group_ids: torch.Tensor,
    gamma: float = 0.95,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> list[list[float]]:
    """GiGPO's step-level advantage (arXiv 2505.10978): each turn's discounted return from that turn on,
    R_k = sum_{j >= k} gamma^(j - k) r_j, relative to the other turns of the same group that saw the same state
    (its anchor-state group), as in :func:`compute_group_advantages`. A state seen once in its group gets 0.

    Returns:
        Per trajectory, one step advantage per turn.
    """
    step_returns: list[list[float]] = []
    for rewards in turn_rewards:
        running, out = 0.0, []
        for r in reversed(rewards):
            running = r + gamma * running
            out.append(running)
        step_returns.append(out[::-1])
    anchors: dict[tuple, list[tuple[int, int]]] = {}
    for i, (group, states) in enumerate(zip(group_ids.tolist(), turn_states)):
        for k, state in enumerate(states):
            anchors.setdefault((group, state), []).append((i, k))
    flat = torch.tensor([R for returns in step_returns for R in returns], dtype=torch.float64)
    offsets = [0]
    for returns in step_returns:
        offsets.append(offsets[-1] + len(returns))
    anchor_ids = torch.zeros(len(flat), dtype=torch.long)
    for a, members in enumerate(anchors.values()):
        for i, k in members:
            anchor_ids[offsets[i] + k] = a
    advantages = compute_group_advantages(flat, anchor_ids, normalize_std, eps) if len(flat) else flat.float()
    return [advantages[offsets[i] : offsets[i + 1]].tolist() for i in range(len(step_returns))]


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 1e-8,
    sum_over_shards: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked positions (Bessel-corrected variance), zero off the mask:
    how RAGEN (verl's GAE) normalises advantages over a batch's generated tokens.

    ``sum_over_shards``: when the batch is split over data-parallel learners, sums a tensor over them (an
    all-reduce), so that every shard is whitened with the whole batch's mean and variance.

    The mean and the centring run in float64, so that equal values centre to exactly zero: in float32 the mean of
    equal values is off by a rounding error, which ``rsqrt(var + eps)`` (1e4 at a zero variance) would scale into
    advantages of order 1e-4, a gradient that Adam's first step turns into a full-size step in a random direction,
    and that depends on the order of the shards' all-reduce.
    """
    total = sum_over_shards or (lambda t: t)
    m = mask.double()
    sums = total(torch.stack([(x.double() * m).sum(), m.sum()]))
    count = sums[1]
    centred = (x.double() - sums[0] / count.clamp(min=1)) * m
    var = total((centred**2).sum()) / (count - 1).clamp(min=1)
    return (centred * torch.rsqrt(var + eps)).to(x.dtype)


def compute_group_advantages(
    returns: torch.Tensor, group_ids: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
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
        values = returns[members].double()  # float32 rounding of the mean of equal returns is not their value
        if bool((values == values[0]).all()):
            continue  # no signal: exactly zero, not a rounding error divided by a tiny std
        centred = values - values.mean()
        if normalize_std and members.sum() > 1:
            centred = centred / (values.std() + eps)
        advantages[members] = centred.float()
    return advantages


def compute_batch_advantages(returns: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """BRPO: the GRPO normalisation over the whole batch instead of per group. Returns (B,)."""
    return compute_group_advantages(returns, torch.zeros_like(returns, dtype=torch.long), normalize_std, eps)
