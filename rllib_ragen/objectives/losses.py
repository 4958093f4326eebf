"""StarPO losses on padded (B, T) tensors: per-token formulas, with the reduction kept separate.

Each loss returns a (B, T) matrix; :func:`aggregate` turns it into a scalar by the chosen mode, so every loss
shares one definition of "token-mean" and friends. Metrics come back as namespaced floats.
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import metrics as M


# ---- reduction ------------------------------------------------------------------------------------------------
def _token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def _seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    present = mask.sum(-1) > 0
    return (loss * mask).sum(-1)[present].mean() if present.any() else loss.sum() * 0


def _seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    present = mask.sum(-1) > 0
    per_seq = (loss * mask).sum(-1)[present] / mask.sum(-1)[present]
    return per_seq.mean() if present.any() else loss.sum() * 0


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token-mean": _token_mean,  # every token weighs the same (RAGEN's default)
    "seq-mean-token-sum": _seq_mean_token_sum,  # every trajectory weighs its token sum: long replies count more
    "seq-mean-token-mean": _seq_mean_token_mean,  # every trajectory weighs the same, whatever its length
}


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a (B, T) per-token loss over the positions where ``mask`` (B, T) is 1.

    Modes: ``token-mean`` = sum(l * m) / sum(m); ``seq-mean-token-sum`` = mean_i sum_t l_it m_it;
    ``seq-mean-token-mean`` = mean_i (sum_t l_it m_it / sum_t m_it). Trajectories with no masked token are left
    out of the sequence means.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {mode!r}: choose one of {sorted(AGGREGATIONS)}.")
    return AGGREGATIONS[mode](loss, mask.to(loss.dtype))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return _token_mean(x.detach().float(), mask.float()).item()


# ---- policy -----------------------------------------------------------------------------------------------------
LOG_RATIO_BOUND = 20.0  # |log pi - log pi_old| is clamped to this before exp (exp(20) ~ 4.9e8)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
    aggregation: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate with asymmetric ("clip-higher") and dual clipping.

    rho = exp(clamp(logp - old_logp, -20, 20))
    L = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))          (arXiv 1707.06347, eqn. 7; DAPO 2503.14476)
    for A < 0 with dual clip c:  L = min(L, -A c)                       (arXiv 1912.09729, eqn. 5)

    Args:
        logp, old_logp: (B, T) log-probs of the sampled tokens under the current / behaviour policy.
        advantages: (B, T).
        mask: (B, T) 1 on the policy's tokens.
        clip_low, clip_high: eps_low and eps_high.
        dual_clip: c > 1 (``StarPOConfig.validate`` checks it), or None to switch dual clipping off.

    Returns:
        The scalar loss and metrics: clip fractions (all, high, low, dual), KL of the update (k1 and k3), ratio mean.
        See ``rllib_ragen.metrics`` for how they map to verl's names.
    """
    # Clamped before exp, as verl does: past ~88 exp overflows float32 and the loss turns NaN. A token that far
    # off the behaviour policy is clipped by PPO anyway, so the clamp changes no finite loss.
    log_ratio = torch.clamp(logp - old_logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    # k3 estimator of KL(old || new), http://joschu.net/blog/kl-approx.html: (rho - 1) - log rho >= 0.
    approx_kl = (ratio - 1) - log_ratio
    surrogate = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    loss = torch.maximum(surrogate, clipped)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    clipped_high = (ratio > 1 + clip_high) & (advantages > 0)
    clipped_low = (ratio < 1 - clip_low) & (advantages < 0)
    metrics = {
        M.PG_CLIPFRAC: masked_mean((clipped_high | clipped_low).float(), mask),
        M.PG_CLIPFRAC_HIGH: masked_mean(clipped_high.float(), mask),
        M.PG_CLIPFRAC_LOW: masked_mean(clipped_low.float(), mask),
        M.PG_CLIPFRAC_DUAL: masked_mean(dual.float(), mask),
        M.PPO_KL: masked_mean(-log_ratio, mask),
        M.APPROX_KL_K3: masked_mean(approx_kl, mask),
        M.RATIO_MEAN: masked_mean(ratio, mask),
    }
    total = aggregate(loss, mask, aggregation)
    metrics[M.PG_LOSS] = total.item()
    return total, metrics


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of every token given the ones before it, aligned to the token it scores.

    out[b, t] = log softmax(logits[b, t - 1] / temperature)[token_ids[b, t]] for t >= 1; out[b, 0] = 0 (nothing
    predicts the first token). The one definition the module, the KL reference pass and the warm start share, and
    what the inference backends record while sampling (``log_softmax(raw_logits / T)`` of the sampled token).

    Args:
        logits: (B, T, V) the model's logits over the whole sequence.
        token_ids: (B, T) the sequence.
        temperature: T > 0; the learner must score with the temperature the rollout sampled at.

    Returns:
        (B, T) float32 log-probs.
    """
    return _logprobs_of(_next_token_logits(logits, temperature), token_ids)


def token_logprobs_and_entropy(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs` and the entropy of each distribution a token was drawn from, from one scaled copy of
    the logits (a (B, T, V) float tensor: large for a large vocabulary).

    entropy[b, t] = H(softmax(logits[b, t - 1] / temperature)) for t >= 1; entropy[b, 0] = 0. Both (B, T).
    """
    scaled = _next_token_logits(logits, temperature)
    return _logprobs_of(scaled, token_ids), shift_right(entropy_from_logits(scaled))


def scored_token_logprobs(
    hidden: torch.Tensor, head: torch.nn.Module, token_ids: torch.Tensor, scored: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """:func:`token_logprobs` at the ``scored`` positions only, zero elsewhere, from the trunk's hidden states: the
    LM head and the log-softmax run on the rows that predict a scored token, not on every position.

    A loss reads only the sampled (or demonstrated) tokens, a fifth of a multi-turn batch or less; over a 49k-token
    vocabulary the full (B, T, V) logits, their float copy and their softmax are gigabytes and most of an update's
    time on a CPU. Each scored value is computed as the full version computes it (the head's row for that position,
    then ``log_softmax(z / T)``), so the two agree to float rounding (tested).

    Args:
        hidden: (B, T, H) the trunk's last hidden states (``model.get_decoder()``'s ``last_hidden_state``).
        head: the LM head (``model.get_output_embeddings()``).
        token_ids: (B, T) the sequence.
        scored: (B, T) 1 where a token's log-prob is wanted (position 0 is never scored: nothing predicts it).
        temperature: as :func:`token_logprobs`.

    Returns:
        (B, T) float32 log-probs, 0 where not scored.
    """
    where = scored[:, 1:].bool()  # token t is scored from the hidden state at t - 1
    logp, _ = _head_scores(hidden[:, :-1][where], head, token_ids[:, 1:][where], temperature, entropy=False)
    return _placed(where, logp)


def scored_logprobs_and_entropy(
    hidden: torch.Tensor, head: torch.nn.Module, token_ids: torch.Tensor, scored: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`scored_token_logprobs` and, at the same positions, the entropy of the distribution each token was
    drawn from (:func:`token_logprobs_and_entropy`'s); both (B, T), 0 where not scored."""
    where = scored[:, 1:].bool()
    logp, entropy = _head_scores(hidden[:, :-1][where], head, token_ids[:, 1:][where], temperature, entropy=True)
    return _placed(where, logp), _placed(where, entropy)


# Numbers of the LM head's float32 output a pass keeps at once where gradients flow: 16M (64 MB). Past that, the rows go
# through the head in chunks, each re-run in the backward pass: a SmolLM2 warm-start pass of four demonstrations
# (about 1,000 reply tokens over 49,152 words) otherwise holds their logits, its float copy and log-softmax, and then
# their gradients, near 1 GB. The tiny model's vocabulary of 1,024 chunks only past 16,384 rows.
HEAD_CHUNK_NUMBERS = 2**24


def _head_scores(
    rows: torch.Tensor, head: torch.nn.Module, tokens: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N,) float32 log-probs of ``tokens`` under ``log_softmax(head(rows) / T)`` and (``entropy``) the entropy of
    each row's distribution. With gradients and more rows than a chunk (``HEAD_CHUNK_NUMBERS``), chunk by chunk under
    activation checkpointing: the same values to float rounding, in the memory of one chunk."""
    vocabulary = getattr(head, "out_features", None)  # a linear head's; another (a test's identity) runs whole
    chunk = max(1, HEAD_CHUNK_NUMBERS // vocabulary) if vocabulary else len(rows)
    if not torch.is_grad_enabled() or len(rows) <= chunk:
        return _scores(rows, head, tokens, temperature, entropy)
    from torch.utils.checkpoint import checkpoint

    parts = [
        checkpoint(_scores, rows[i : i + chunk], head, tokens[i : i + chunk], temperature, entropy, use_reentrant=False)
        for i in range(0, len(rows), chunk)
    ]
    return (torch.cat([logp for logp, _ in parts]), torch.cat([ent for _, ent in parts]) if entropy else None)


def _scores(
    rows: torch.Tensor, head: torch.nn.Module, tokens: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    scaled = head(rows).float() / temperature
    logp = torch.log_softmax(scaled, -1).gather(-1, tokens[:, None]).squeeze(-1)
    return logp, entropy_from_logits(scaled) if entropy else None


def _placed(where: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(B, T) float32: ``values`` at the positions after ``where``'s, zeros elsewhere."""
    out = values.new_zeros(where.shape, dtype=torch.float32)
    out[where] = values.float()
    return shift_right(out)


def _next_token_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T, V) -> (B, T-1, V) float32 logits of tokens 1..T-1, divided by the temperature."""
    return logits[:, :-1].float() / temperature


def _logprobs_of(scaled: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    return shift_right(torch.log_softmax(scaled, -1).gather(-1, token_ids[:, 1:, None]).squeeze(-1))


def shift_right(x: torch.Tensor) -> torch.Tensor:
    """(B, T-1) scores of tokens 1..T-1 -> (B, T) with a zero for token 0, which nothing predicts."""
    return torch.nn.functional.pad(x, (1, 0))


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: logsumexp(z) - sum softmax(z) z. (B, T, V) -> (B, T)."""
    logits = logits.float()
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)


# ---- KL to a reference policy -----------------------------------------------------------------------------------
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": lambda logp, ref: logp - ref,  # unbiased, high variance, can be negative per token
    "k2": lambda logp, ref: 0.5 * (logp - ref) ** 2,  # "mse": low variance, biased
    "k3": lambda logp, ref: torch.exp(ref - logp) - (ref - logp) - 1,  # "low_var_kl": unbiased and >= 0
}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs (B, T) -> (B, T).

    Estimators from http://joschu.net/blog/kl-approx.html with r = pi_ref / pi: k1 = -log r, k2 = (log r)^2 / 2,
    k3 = r - 1 - log r.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator {estimator!r}: choose one of {sorted(KL_ESTIMATORS)}.")
    return KL_ESTIMATORS[estimator](logp, ref_logp)


def truncated_importance_weights(
    proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled PPO's per-token weight ``min(pi_prox / pi_behav, cap)`` (B, T), 0 off the mask, and the (B, T)
    boolean of tokens the cap cut.

    With rollouts played by an older policy pi_behav, the clipped ratio is taken against the proximal policy
    pi_prox (the learner's before the update) and this weight corrects for where the tokens were sampled from.
    Multiplying each token's advantage by it equals multiplying its clipped surrogate, since it is positive and
    constant (no gradient flows through it).
    """
    weight = torch.exp((proximal_logp - behaviour_logp) * mask)  # masked positions: exp(0) = 1, zeroed below
    return weight.clamp(max=cap) * mask, (weight > cap) & (mask > 0)


# ---- critic -----------------------------------------------------------------------------------------------------
def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.5,
    aggregation: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss: 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)  (arXiv 2005.12729 sec. 3.3).

    Args:
        values, old_values, returns, mask: (B, T).
        clip: c, or None for the plain squared error.
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        loss, clipfrac = 0.5 * unclipped, torch.zeros_like(unclipped)
    else:
        # Where the clamp does not act, old + (V - old) is V up to rounding; use V itself, so a token counts as
        # clipped only when the clip really moved its value and that made the loss larger.
        moved = (values - old_values).abs() > clip
        clipped_values = torch.where(moved, old_values + torch.clamp(values - old_values, -clip, clip), values)
        clipped = (clipped_values - returns) ** 2
        loss, clipfrac = 0.5 * torch.maximum(unclipped, clipped), (moved & (clipped > unclipped)).float()
    total = aggregate(loss, mask, aggregation)
    return total, {
        M.VF_LOSS: total.item(),
        M.VF_CLIPFRAC: masked_mean(clipfrac, mask),
        M.EXPLAINED_VARIANCE: explained_variance(values, returns, mask),
    }


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over masked tokens: 1 is a perfect critic, 0 no better than a constant."""
    m = mask.bool()
    r, v = returns.detach().float()[m], values.detach().float()[m]
    var = r.var(unbiased=False) if r.numel() else torch.tensor(0.0)
    return float("nan") if var == 0 else (1 - (r - v).var(unbiased=False) / var).item()
