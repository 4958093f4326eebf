"""The StarPO learner: one call to ``update`` takes a whole (filtered) rollout batch.

It first scores the batch once without gradients (the old log-probs, the critic's old values, the reference
policy's log-probs), computes the advantages (``batch_advantages.py``: before the scores for an estimator without a
critic, from them for one with a critic), then runs ``num_epochs`` passes of
``updates_per_rollout_batch`` optimizer steps, each accumulating gradients over micro-batches. RLlib's own
minibatch loop is not used: it has no gradient accumulation and would score every minibatch separately.

When the batch is trained by one optimizer step (the CPU jobs' setting), the scoring pass and the step's forward
passes would compute the same numbers from the same weights on the same rows: each micro-batch's own forward pass,
detached, is its score, and the batch goes through the model once instead of twice. With several micro-batches this
needs a critic-free estimator: a critic's advantages are whitened over the whole batch's scores before any loss.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch
import torch.distributed as dist
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from .. import metrics as M
from ..objectives import (
    ADVANTAGE_ESTIMATORS,
    ONE_LEARNER,
    Shards,
    advantage_recursion_mask,
    aggregate,
    kl_penalty,
    policy_loss,
    token_logprobs,
    truncated_importance_weights,
    value_loss,
)
from ..rollout.models import load_policy
from .batch_advantages import batch_advantages, process_group_shards
from .collapse_probe import CollapseProbe
from .learner_optimizers import LearnerOptimizers
from .llm_rl_module import trimmed_inputs

LOSS_COLUMNS = (
    "response_mask",
    "loss_mask",
    "value_mask",
    "old_logp",
    "token_advantages",
    "ref_logp",
    "old_values",
    "returns",
)


class StarPOTorchLearner(CollapseProbe, LearnerOptimizers, TorchLearner):
    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        self._skipped_in_a_row = 0  # consecutive optimizer steps skipped for a non-finite loss or gradient
        self._lr_factor = 1.0  # a sentinel rollback's multiplier of the configured learning rates
        self._reference = None
        self._shards = 1  # data-parallel learners taking part in the update running now (1: outside an update)
        # The frozen reference policy exists only when the KL term is on. With LoRA it is the policy with its
        # adapters switched off (see _reference_logits): no second copy of the weights.
        any_module = self.module[next(iter(self.module.keys()))]  # separate policies share the model's settings
        if self.config.kl_coeff > 0 and not any_module.unwrapped().lora:
            cfg = self.config.model_config
            self._reference, _ = load_policy(
                cfg["model"], dtype=cfg.get("dtype", "float32"), seed=int(cfg.get("seed", 0))
            )
            self._reference.requires_grad_(False).to(self._device)

    def _precision(self, config):
        """The context of every forward pass the learner makes: bfloat16 autocast when ``autocast_dtype`` asks for
        it (weights, gradients and optimizer moments stay in the model's dtype), else nothing."""
        if config.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self._device.type, dtype=getattr(torch, config.autocast_dtype))

    # ---- data-parallel learners: every shard trains as a part of the whole batch -----------------------------------
    def _sum_over_learners(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the learners of this update (an all-reduce in RLlib's torch process group)."""
        if self._shards == 1:
            return x
        x = x.clone()
        dist.all_reduce(x)
        return x

    def _shards_now(self) -> Shards:
        """The other learners' part of this update, for the estimators (``batch_advantages.py``)."""
        return ONE_LEARNER if self._shards == 1 else process_group_shards(self._device)

    def _smallest_and_largest_shard(self, size: int) -> tuple[int, int]:
        """The fewest and most rows any learner holds in this update: the choices that decide which collective
        operations a learner runs (its number of optimizer steps, scoring in its step or apart) must be the same on
        every learner, or their all-reduces would pair up wrongly and hang."""
        if self._shards == 1:
            return size, size
        both = torch.tensor([-size, size], device=self._device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        return int(-both[0]), int(both[1])

    # ---- the update ------------------------------------------------------------------------------------------------
    @override(TorchLearner)
    def _update(self, batch: dict[str, Any], **kwargs):
        # Several learners (RLlib's DDP): each holds a shard of whole groups. The normalisers of the losses and the
        # whitening statistics are summed over all shards, so the averaged gradient is the whole batch's.
        self._shards = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        losses = {}
        try:
            for module_id in sorted(batch):  # separate policies: each trained one on its own seats' rows
                losses.update(self._update_shard(batch, module_id))
        finally:
            self._shards = 1
        return {}, losses, {}

    def _update_shard(self, batch: dict[str, Any], module_id: str) -> dict:
        config = self.config.get_config_for_module(module_id)
        data = {k: v.to(self._device) for k, v in batch[module_id].items()}
        module = self.module[module_id]
        size = data["input_ids"].shape[0]
        smallest, largest = self._smallest_and_largest_shard(size)
        t0 = time.perf_counter()

        # Row order of every epoch, fixed up front from the learner's update counter so a resumed run repeats it.
        generator = torch.Generator().manual_seed(int((config.seed or 0) * 1_000_003 + self._weights_seq_no))
        orders = [
            torch.arange(size)
            if epoch == 0 and not config.shuffle_batch_per_epoch
            else torch.randperm(size, generator=generator)
            for epoch in range(config.num_epochs)
        ]
        # With several learners, minibatch i of the update is every learner's own i-th slice of its shard.
        rows_in_update = int(self._sum_over_learners(torch.tensor(float(size), device=self._device)).item())
        steps = min(smallest, config.optimizer_steps(rows_in_update))
        minibatches = [order[i * size // steps : (i + 1) * size // steps] for order in orders for i in range(steps)]
        micro_size = config.micro_batch_size or size
        if micro_size < size:  # micro-batches of similar lengths pad less; a step's gradient is their sum either way
            lengths = data["attention_mask"].sum(-1).cpu()
            minibatches = [rows[torch.argsort(lengths[rows], descending=True, stable=True)] for rows in minibatches]

        if self._step_scores_itself(len(minibatches), config.micro_batch_size or largest, largest, config):
            self._start_scores(data, config)
            total, applied = self._optimizer_step(
                data, minibatches[0], module, module_id, config, micro_size, first=True, scores_itself=True
            )
            self._log_scores(data, config, module_id)
            skipped, passes = int(not applied), 1
        else:
            # Score once, in the exact micro-batches the first optimizer step will use: the first step's ratio is 1.
            self._prepare(
                data,
                module,
                config,
                [mb[i : i + micro_size] for mb in minibatches[:steps] for i in range(0, len(mb), micro_size)],
                module_id,
            )
            total, skipped = None, 0
            for step, rows in enumerate(minibatches):
                total, applied = self._optimizer_step(
                    data, rows, module, module_id, config, micro_size, first=step == 0
                )
                skipped += not applied
            passes = config.num_epochs + 1
        self.metrics.log_value((module_id, M.SKIPPED_OPTIMIZER_STEPS), skipped, window=1)
        tokens = int(data["attention_mask"].sum()) * passes
        self.metrics.log_value((module_id, M.UPDATE_TOKENS_PER_S), tokens / (time.perf_counter() - t0), window=1)
        self.metrics.log_value((module_id, M.OPTIMIZER_STEPS), len(minibatches), window=1)
        return {module_id: total}

    @staticmethod
    def _step_scores_itself(optimizer_steps: int, micro_size: int, size: int, config) -> bool:
        """Whether the only optimizer step's forward passes can serve as the score: one step sees every row with
        the weights the score would use. In several micro-batches only without a critic, whose advantages need
        the whole batch's values (whitened over it) before the first micro-batch's loss."""
        one_micro_batch = micro_size >= size
        return optimizer_steps == 1 and (
            one_micro_batch or not ADVANTAGE_ESTIMATORS[config.advantage_estimator].needs_critic
        )

    @torch.no_grad()
    def _prepare(self, data: dict, module, config, micro_batches: list[torch.Tensor], module_id: str) -> None:
        """Score the batch without gradients, in ``micro_batches``, and fill ``old_logp``, ``old_values``,
        ``ref_logp``, ``token_advantages`` and ``returns`` into ``data``; the scores' gaps are logged under
        ``module_id``."""
        self._start_scores(data, config)
        scored = torch.cat(micro_batches)
        with _prefix_read_once(module, data, scored, len(micro_batches)):
            for rows in micro_batches:
                inputs = trimmed_inputs(data, rows)
                with self._precision(config):
                    out = module.forward_train(_scoring_sampled_tokens(inputs, data, rows))
                self._score(data, module, config, rows, inputs, out)
        self._finish_scores(data, config)
        self._log_scores(data, config, module_id)

    def _start_scores(self, data: dict, config) -> None:
        """Empty score tensors, filled micro-batch by micro-batch by :meth:`_score`."""
        mask = data["response_mask"]
        data.setdefault("loss_mask", mask)  # a batch not built by prepare_update_batch trains every sampled token
        data["learner_logp"], data["old_values"] = torch.zeros_like(mask), torch.zeros_like(mask)
        data["ref_logp"] = torch.zeros_like(mask) if config.kl_coeff > 0 else None
        # The critic learns, and the recursion reads, values on the tokens of the advantage mask.
        data["value_mask"] = advantage_recursion_mask(mask, config.advantage_mask)
        if not ADVANTAGE_ESTIMATORS[config.advantage_estimator].needs_critic:  # no scores needed: once, up front
            data["outcome_advantages"], _ = batch_advantages(data, config, shards=self._shards_now())

    @torch.no_grad()
    def _score(self, data: dict, module, config, rows: torch.Tensor, inputs: dict, out: dict) -> None:
        """Store the score of micro-batch ``rows``: ``out``, ``forward_train``'s output on ``inputs`` at the
        current weights (its values, not its gradients), and the reference policy's log-probs."""
        width = inputs["input_ids"].shape[1]
        data["learner_logp"][rows, :width] = out["logp"].detach()
        if "values" in out:
            data["old_values"][rows, :width] = out["values"].detach()
        if data["ref_logp"] is not None:
            logits = self._reference_logits(module, inputs, config)
            data["ref_logp"][rows, :width] = token_logprobs(logits, inputs["input_ids"], config.temperature)

    @torch.no_grad()
    def _finish_scores(self, data: dict, config) -> None:
        """From the scores stored so far: the old log-probs, the advantages (a critic's, from its values) and the
        value targets. Token by token for the critic-free estimators, so rows scored later do not change those
        already prepared."""
        mask, behaviour, learner_logp = data["response_mask"], data["behaviour_logprobs"], data["learner_logp"]
        data["old_logp"] = learner_logp * mask if config.recompute_logprobs else behaviour * mask
        if ADVANTAGE_ESTIMATORS[config.advantage_estimator].needs_critic:
            advantages, returns = batch_advantages(data, config, values=data["old_values"], shards=self._shards_now())
        else:
            advantages, returns = data["outcome_advantages"], torch.zeros_like(mask)
        if config.max_policy_lag:  # the off-policy correction of a rollout one update old
            data["importance_weights"], data["importance_truncated"] = truncated_importance_weights(
                learner_logp, behaviour, mask, config.importance_weight_cap
            )
            advantages = advantages * data["importance_weights"]
        data["token_advantages"], data["returns"] = advantages, returns

    @torch.no_grad()
    def _log_scores(self, data: dict, config, module_id: str) -> None:
        """Log, once per batch, the gap between the rollout's and the learner's log-probs and, with a policy lag,
        the importance weights (see ``truncated_importance_weights``)."""
        mask, behaviour, learner_logp = data["response_mask"], data["behaviour_logprobs"], data["learner_logp"]
        tokens = mask.sum().clamp(min=1)
        gap = (learner_logp - behaviour).abs() * mask
        self.metrics.log_value((module_id, M.LOGPROB_GAP_MAX), gap.max().item(), window=1)
        self.metrics.log_value((module_id, M.LOGPROB_GAP_MEAN), (gap.sum() / tokens).item(), window=1)
        if config.max_policy_lag:
            weight, truncated = data["importance_weights"], data["importance_truncated"]
            self.metrics.log_value((module_id, M.IMPORTANCE_WEIGHT_MEAN), (weight.sum() / tokens).item(), window=1)
            self.metrics.log_value(
                (module_id, M.IMPORTANCE_WEIGHT_TRUNCATED), (truncated.sum() / tokens).item(), window=1
            )

    def _reference_logits(self, module, inputs: dict[str, torch.Tensor], config) -> torch.Tensor:
        with self._precision(config):
            if self._reference is not None:
                return self._reference(**inputs, use_cache=False).logits
            with module.unwrapped().policy.disable_adapter():  # LoRA: the base weights are the reference policy
                return module.unwrapped().policy(**inputs, use_cache=False).logits

    def _optimizer_step(
        self,
        data: dict,
        rows: torch.Tensor,
        module,
        module_id,
        config,
        micro_size: int,
        first: bool,
        scores_itself: bool = False,
    ) -> tuple[torch.Tensor, bool]:
        """One optimizer step on the minibatch ``rows``, accumulating gradients over micro-batches.

        Each micro-batch's loss is weighted by its share of the minibatch's normaliser (tokens for token-mean,
        trajectories for the sequence means), so the accumulated gradient equals the whole minibatch's. Returns
        the loss and whether the step was applied: a non-finite loss or gradient skips it (see
        :meth:`_skip_non_finite`). ``scores_itself``: each micro-batch's forward pass is also its score
        (:meth:`_step_scores_itself`), stored before its loss reads it.
        """
        per_token = config.loss_aggregation == "token-mean"

        def normaliser(mask: torch.Tensor) -> torch.Tensor:  # what the aggregation divides by
            return mask.sum() if per_token else (mask.sum(-1) > 0).sum()

        # The policy terms are normalised over the trained tokens, the value loss over the advantage mask's: over
        # every learner's, times the learners, as DDP averages the learners' gradients.
        keys = ("loss_mask", "value_mask")
        totals = self._sum_over_learners(torch.stack([normaliser(data[key][rows]).float() for key in keys]))
        denominators = {key: total.clamp(min=1) / self._shards for key, total in zip(keys, totals)}
        for optimizer in self._optimizer_parameters:
            optimizer.zero_grad(set_to_none=True)
        micro_batches = [rows[i : i + micro_size] for i in range(0, len(rows), micro_size)]
        total = torch.zeros(())
        with _prefix_read_once(module, data, rows, len(micro_batches)):
            for index, micro in enumerate(micro_batches):
                shares = {key: normaliser(data[key][micro]) / denominators[key] for key in denominators}
                if not any(share > 0 for share in shares.values()):
                    continue
                sync = index == len(micro_batches) - 1 or not hasattr(module, "no_sync")
                with contextlib.nullcontext() if sync else module.no_sync():
                    loss = self._micro_loss(
                        data,
                        micro,
                        module,
                        module_id,
                        config,
                        first and index == 0,
                        policy_share=shares["loss_mask"],
                        value_share=shares["value_mask"],
                        score=scores_itself,
                    )
                    loss.backward()
                total = total + loss.detach()
        gradients = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        if self._skip_non_finite(total, gradients, config):
            return total, False
        self.apply_gradients(self.postprocess_gradients(gradients))
        return total, True

    def _skip_non_finite(self, loss: torch.Tensor, gradients: dict, config) -> bool:
        """True (and the gradients dropped) when the loss or a gradient is NaN or infinite.

        RLlib would turn such gradients into zeros and the largest float, which fills Adam's moments with values
        no later step recovers from: the step is skipped instead, weights and optimizer state untouched.
        """
        # One device sync for all gradients, not one per parameter tensor.
        finite = torch.stack([torch.isfinite(loss).all()] + [torch.isfinite(g).all() for g in gradients.values()])
        if finite.all():
            self._skipped_in_a_row = 0
            return False
        for optimizer in self._optimizer_parameters:
            optimizer.zero_grad(set_to_none=True)
        self._skipped_in_a_row += 1
        if self._skipped_in_a_row >= config.max_consecutive_skipped_steps:
            raise FloatingPointError(
                f"{self._skipped_in_a_row} optimizer steps in a row had a non-finite loss or gradient (loss "
                f"{loss.item()}); weights and optimizer state are as before the first. Likely causes: a learning "
                f"rate too high (lr={config.lr}, critic_lr={config.critic_lr}) or rewards too large "
                "(rescale the environment's rewards). max_consecutive_skipped_steps sets how many are tolerated."
            )
        return True

    def _micro_loss(
        self,
        data: dict,
        rows: torch.Tensor,
        module,
        module_id,
        config,
        first: bool,
        *,
        policy_share: torch.Tensor,
        value_share: torch.Tensor,
        score: bool = False,
    ) -> torch.Tensor:
        """The loss of micro-batch ``rows``, its policy and value terms weighted by their shares of the minibatch's
        normalisers, so that the accumulated gradient is the whole minibatch's. ``score``: this forward pass is
        also the rows' score, stored before the loss reads it."""
        inputs = trimmed_inputs(data, rows)
        width = inputs["input_ids"].shape[1]
        with self._precision(config):
            fwd_out = module.forward_train(_scoring_sampled_tokens(inputs, data, rows))
        if score:
            self._score(data, module, config, rows, inputs, fwd_out)
            self._finish_scores(data, config)
        batch = {
            **inputs,
            **{key: data[key][rows, :width] for key in LOSS_COLUMNS if data.get(key) is not None},
            "policy_share": policy_share,
            "value_share": value_share,
        }
        if first:  # before any step: old and new log-probs come from the same weights and the same computation
            deviation = ((fwd_out["logp"] - batch["old_logp"]).abs() * batch["response_mask"]).max().item()
            self.metrics.log_value((module_id, M.FIRST_STEP_LOGPROB_DEVIATION), deviation, window=1)
        return self.compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)

    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch: dict[str, Any], fwd_out: dict[str, Any]):
        """The StarPO loss on one prepared batch: clipped surrogate - entropy bonus (+ KL) (+ value loss).

        ``batch`` holds ``response_mask`` (every sampled token), ``loss_mask`` (those the policy terms train),
        ``value_mask`` (those the value loss trains: the advantage recursion's),
        ``old_logp``, ``token_advantages`` and, as configured, ``ref_logp``, ``old_values`` and ``returns`` (all
        (B, T)), plus the micro-batch's ``policy_share`` and ``value_share`` (1 for a whole minibatch);
        ``fwd_out`` is ``forward_train``'s output on it.
        """
        agg = config.loss_aggregation
        mask, trained = batch["value_mask"], batch["loss_mask"]
        pg, metrics = policy_loss(
            fwd_out["logp"],
            batch["old_logp"],
            batch["token_advantages"],
            trained,
            clip_low=config.clip_ratio_low,
            clip_high=config.clip_ratio_high,
            dual_clip=config.dual_clip,
            aggregation=agg,
        )
        entropy = aggregate(fwd_out["entropy"], trained, agg)
        policy = pg - config.entropy_coeff * entropy
        metrics[M.ENTROPY] = entropy.item()
        if batch.get("ref_logp") is not None:
            kl = aggregate(kl_penalty(fwd_out["logp"], batch["ref_logp"], config.kl_estimator), trained, agg)
            policy = policy + config.kl_coeff * kl
            metrics[M.KL_TO_REFERENCE] = kl.item()
        loss = batch.get("policy_share", 1.0) * policy
        if "values" in fwd_out:
            vf, critic_metrics = value_loss(
                fwd_out["values"], batch["old_values"], batch["returns"], mask, clip=config.value_clip, aggregation=agg
            )
            loss = loss + batch.get("value_share", 1.0) * config.vf_loss_coeff * vf
            metrics.update(critic_metrics)
            metrics[M.VALUES_MEAN] = float((fwd_out["values"].detach() * mask).sum() / mask.sum().clamp(min=1))
        for key, value in metrics.items():
            if not math.isnan(value):
                self.metrics.log_value((module_id, key), value, window=1000)
        return loss


def _scoring_sampled_tokens(inputs: dict, data: dict, rows: torch.Tensor) -> dict:
    """``forward_train``'s batch: the model inputs, and the tokens to score, the sampled ones (every loss, the
    log-prob gap and the scores read those alone; the module skips the LM head elsewhere)."""
    return {**inputs, "score_mask": data["response_mask"][rows, : inputs["input_ids"].shape[1]]}


def _prefix_read_once(module, data: dict, rows: torch.Tensor, passes: int):
    """The context in which ``passes`` micro-batches over ``rows`` read their common prefix once, where the module
    can (``CausalLMRLModule.prefix_read_once``). Not under DDP: it averages the gradients in the last pass's
    backward, before the prefix's share would be added."""
    share = getattr(module.unwrapped(), "prefix_read_once", None)
    if passes < 2 or share is None or hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return share(data["input_ids"][rows], data["attention_mask"][rows])
