"""The echo-trap probe on the learner (``rllib_ragen/collapse.py`` defines its measures): every
``collapse_diagnostics_interval`` iterations (the buckets' gradient norms with the first run in every window of
``gradient_analysis_interval`` iterations), before the update, on the update's own batch and weights.

:class:`CollapseProbe` is a part of :class:`~rllib_ragen.starpo.starpo_learner.StarPOTorchLearner`: it scores with
the learner's own preparation of a batch (``_prepare``), precision and device, and leaves weights, optimizer state
and gradients as they were.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from .. import metrics as M
from ..collapse import VARIANCE_BUCKETS, CrossScoringPairs, cross_scoring, variance_buckets
from ..objectives import policy_loss, scored_token_logprobs
from ..rollout.models import forward_sharing_prefix
from .llm_rl_module import trimmed_inputs


class CollapseProbe:
    """The learner's echo-trap probe: cross-scoring of reasonings under prompts, and the policy-gradient norm of
    each reward-variance bucket."""

    def collapse_probe(
        self,
        batch: dict[str, np.ndarray],
        pairs: CrossScoringPairs | None,
        *,
        gradient_norms: bool = True,
        module_id: str = DEFAULT_MODULE_ID,
    ) -> tuple[dict[str, float], np.ndarray]:
        """Cross-scoring, each reward-variance bucket's share of groups and (``gradient_norms``) its
        policy-gradient norm, on the current weights.

        Leaves weights, optimizer state and gradients as they were. ``batch`` is the update's (kept) batch;
        ``pairs`` the first-turn prompts and reasonings to cross-score (None: skip). Returns the metrics and the
        batch's (B, T) token advantages, as the update will use them (for the rollout viewer). ``module_id``: the
        policy whose batch it is (separate policies are probed one by one).
        """
        config = self.config.get_config_for_module(module_id)
        # The probe runs on one learner: through the DDP wrapper, a forward pass broadcasts buffers to the other
        # learners, which never join, and every learner hung there at the first probe.
        module = self.module[module_id].unwrapped()
        results = self._cross_scores(module, pairs, config) if pairs is not None else {}
        data = {k: torch.as_tensor(v).to(self._device) for k, v in batch.items()}
        micro_size = config.micro_batch_size or data["input_ids"].shape[0]
        rows = torch.arange(data["input_ids"].shape[0])
        micro_batches = [rows[i : i + micro_size] for i in range(0, len(rows), micro_size)]
        self._prepare(data, module, config, micro_batches, module_id)
        buckets = variance_buckets(
            data["episode_return"].cpu().numpy(), data["group"].cpu().numpy(), data["trajectory"].cpu().numpy()
        )
        num_groups = len(torch.unique(data["group"]))
        for name in VARIANCE_BUCKETS:
            in_bucket = torch.as_tensor(buckets.get(name, np.zeros(0, dtype=np.int64)))
            results[M.BUCKET_SHARE.format(bucket=name)] = len(torch.unique(data["group"][in_bucket])) / num_groups
            if gradient_norms and len(in_bucket):
                results[M.GRAD_NORM_BUCKET.format(bucket=name)] = self._policy_gradient_norm(
                    data, in_bucket, module, config, micro_size
                )
        return results, (data["token_advantages"] * data["response_mask"]).cpu().numpy()

    @torch.no_grad()
    def _cross_scores(self, module, pairs: CrossScoringPairs, config) -> dict[str, float]:
        """Score every reasoning under every prompt (one padded batch per ``inference_batch_size`` rows)."""
        ids, masks, index = pairs.sequences()
        scores = np.zeros((len(pairs), len(pairs)))
        step = max(1, config.inference_batch_size)
        for start in range(0, len(ids), step):
            chunk = range(start, min(start + step, len(ids)))
            width = max(len(ids[r]) for r in chunk)
            input_ids = torch.zeros((len(chunk), width), dtype=torch.long)
            attention, scored = torch.zeros_like(input_ids), torch.zeros((len(chunk), width))
            for row, r in enumerate(chunk):
                input_ids[row, : len(ids[r])] = torch.tensor(ids[r])
                attention[row, : len(ids[r])] = 1
                scored[row, : len(masks[r])] = torch.tensor(masks[r], dtype=torch.float32)
            input_ids, attention = input_ids.to(self._device), attention.to(self._device)
            with self._precision(config):
                totals = (
                    _scored_logprobs(module.policy, input_ids, attention, scored.to(self._device), config.temperature)
                    .cpu()
                    .sum(-1)
                )
            for row, r in enumerate(chunk):
                scores[index[r]] = float(totals[row])
        return cross_scoring(scores)

    def _policy_gradient_norm(self, data: dict, rows: torch.Tensor, module, config, micro_size: int) -> float:
        """Norm of the clipped-surrogate gradient on ``rows`` alone (normalised over their own tokens). The policy
        alone is run (``forward_train`` would run the critic's trunk too, whose values this needs not)."""
        total_tokens = data["loss_mask"][rows].sum().clamp(min=1)
        policy = module.unwrapped().policy
        actor = list(policy.parameters())
        no_sync = module.no_sync if hasattr(module, "no_sync") else contextlib.nullcontext
        with no_sync():
            for i in range(0, len(rows), micro_size):
                micro = rows[i : i + micro_size]
                inputs = trimmed_inputs(data, micro)
                width = inputs["input_ids"].shape[1]
                trained = data["loss_mask"][micro, :width]
                with self._precision(config):
                    logp = _scored_logprobs(
                        policy,
                        inputs["input_ids"],
                        inputs["attention_mask"],
                        data["response_mask"][micro, :width],
                        config.temperature,
                    )
                loss, _ = policy_loss(
                    logp,
                    data["old_logp"][micro, :width],
                    data["token_advantages"][micro, :width],
                    trained,
                    clip_low=config.clip_ratio_low,
                    clip_high=config.clip_ratio_high,
                    dual_clip=config.dual_clip,
                    aggregation="token-mean",
                )
                (loss * trained.sum() / total_tokens).backward()
        grads = [p.grad for p in actor if p.grad is not None]
        norm = (
            float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
            if grads
            else 0.0
        )
        for p in module.parameters():
            p.grad = None
        return norm


def _scored_logprobs(
    policy, input_ids: torch.Tensor, attention_mask: torch.Tensor, scored: torch.Tensor, temperature: float
) -> torch.Tensor:
    """(B, T) log-probs of the ``scored`` tokens, zero elsewhere, as the learner's update computes them: the trunk
    reads a shared prompt once, and the LM head runs at the scored positions only (a probe of 128 rows with every
    position's logits took gigabytes)."""
    hidden = forward_sharing_prefix(policy.get_decoder(), input_ids, attention_mask)["last_hidden_state"]
    return scored_token_logprobs(hidden, policy.get_output_embeddings(), input_ids, scored, temperature)
