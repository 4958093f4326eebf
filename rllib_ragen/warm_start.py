"""Supervised warm start: teach a policy the action protocol from demonstrations before RL.

Demonstrations are played through the same rollout engine as RL (a scripted backend speaks for the policy), so
the fine-tuned tokens are exactly the layout RL later samples: the chat template, the observations, and the
reply tokens, of which only the replies (``response_mask``) are trained on.

Example::

    demos = collect_demonstrations(RolloutConfig(env="rllib_ragen/Sokoban-v0"), sokoban_solver_policy(),
                                   tokenizer, num_episodes=2000)
    supervised_warm_start(model, demos, steps=300)
    model.save_pretrained("warm"); tokenizer.save_pretrained("warm")   # then model_config={"model": "warm"}
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Callable, Iterator, Sequence

import torch

from .hardware import cpu_computes_bfloat16, trim_heap
from .objectives import scored_token_logprobs
from .rollout.backends import SamplingParams, ScriptedBackend
from .rollout.rollout_config import RolloutConfig
from .rollout.engine import RolloutEngine
from .rollout.lora import LORA_DEFAULTS, attach_lora
from .rollout.trajectory import Trajectory, pad_trajectories
from .rollout.models import forward_sharing_prefix, prefix_read_once

logger = logging.getLogger(__name__)

# Far from the training (10000...) and validation (123...) seeds, so demonstrations never show those states.
DEMONSTRATION_SEED_START = 1_000_000


def collect_demonstrations(
    rollout_config: RolloutConfig,
    policy: Callable[[str], str],
    tokenizer,
    num_episodes: int,
    seed_start: int = DEMONSTRATION_SEED_START,
    only_successful: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[Trajectory]:
    """Play ``num_episodes`` episodes (distinct initial states) with a scripted ``policy``.

    Args:
        rollout_config: the agent loop the RL run will use (same prompts, budgets and template).
        policy: maps the conversation text to a reply, e.g. ``rllib_ragen.demonstrators.sokoban_solver_policy()``.
        tokenizer: the policy model's tokenizer.
        only_successful: keep only episodes that reached ``success`` (for policies that can fail, e.g. slippery ice).
        progress: called after every turn with the episodes ended and played (``RolloutEngine.rollout``).
    """
    engine = RolloutEngine(rollout_config, ScriptedBackend(policy, tokenizer), tokenizer)
    seeds = list(range(seed_start, seed_start + num_episodes))
    trajectories, _ = engine.rollout(
        seeds, group_size=1, sampling=SamplingParams(max_new_tokens=512), progress=progress
    )
    return [t for t in trajectories if t.success] if only_successful else trajectories


LR_SCHEDULES = ("constant", "cosine")
# Precision of the warm start's forward pass: "float32", or "bfloat16" autocast (weights, gradients, the optimizer
# and the loss stay float32).
WARM_START_PRECISIONS = ("float32", "bfloat16")


def emulated_bfloat16(device: torch.device) -> bool:
    """Whether bfloat16 matrix products on ``device`` run emulated: a CPU with neither AVX512-BF16 nor AMX (torch's
    own checks). There a bfloat16 warm start is far slower than float32, not faster (the Benchmarks page)."""
    return device.type == "cpu" and not cpu_computes_bfloat16()


def warm_start_lr(lr: float, step: int, steps: int, schedule: str) -> float:
    """The learning rate of step ``step`` (0-based) of ``steps`` under ``schedule`` (see ``supervised_warm_start``)."""
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * step / steps))
    return lr


LENGTH_GROUP_BATCHES = 8  # batches sorted together by length: enough to pad little, few enough to stay random


def _autocast(device: torch.device, precision: str):
    """The forward pass's autocast context for ``precision`` (none for float32)."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, precision))


def demonstration_batches(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator, group_by_length: bool = False
) -> Iterator[list[int]]:
    """Index batches of the demonstrations, endlessly: passes in random order, one pass running into the next.

    With ``group_by_length``, ``LENGTH_GROUP_BATCHES`` batches are drawn at once, sorted by ``lengths`` and cut
    into batches, which come out in random order (see ``supervised_warm_start``).
    """
    per_draw = batch_size * (LENGTH_GROUP_BATCHES if group_by_length else 1)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    while True:
        if len(order) < per_draw:
            order += torch.randperm(len(lengths), generator=generator).tolist()
        drawn, order = order[:per_draw], order[per_draw:]
        if not group_by_length:
            yield drawn
            continue
        drawn.sort(key=lambda i: lengths[i])
        grouped = [drawn[k : k + batch_size] for k in range(0, len(drawn), batch_size)]
        for k in torch.randperm(len(grouped), generator=generator).tolist():
            yield grouped[k]


def supervised_warm_start(
    model: torch.nn.Module,
    demonstrations: Sequence[Trajectory],
    *,
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    seed: int = 0,
    pad_token_id: int = 0,
    log_every: int = 50,
    average_decay: float = 0.0,
    lr_schedule: str = "constant",
    group_by_length: bool = False,
    precision: str = "float32",
    evaluate: Callable[[int, str], None] | None = None,
    evaluate_every: int = 0,
    micro_batch_size: int = 0,
    lora_rank: int = 0,
    freeze_embeddings: bool = False,
    progress: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Fine-tune ``model`` in place on the reply tokens of ``demonstrations`` (cross-entropy, AdamW). Demonstrations
    played under a context window train each turn as its own row (``Trajectory.rows``), the prompt RL will show.

    Args:
        average_decay: leave ``model`` holding an exponential moving average of its weights over the steps
            (Polyak averaging, ``torch.optim.swa_utils``), ``avg = decay * avg + (1 - decay) * weights`` after
            every step from the starting weights on, instead of the last step's weights, which at a constant high
            rate land wherever the last batches threw them. 0: the last weights.
        lr_schedule: ``"constant"`` (``lr`` at every step) or ``"cosine"``: step ``k`` of ``steps`` updates at
            ``lr * (1 + cos(pi * k / steps)) / 2``, from ``lr`` down towards 0, so the last steps stop throwing the
            weights around at the full rate.
        group_by_length: draw ``LENGTH_GROUP_BATCHES`` batches' worth of demonstrations at a time, sort them by
            length and cut them into batches, taken in random order. A batch is padded to its longest episode, so
            grouping pads less (``benchmarks/warm_start.py`` measures the time per step). Each demonstration is
            still used once per pass.
        precision: ``"float32"``, or ``"bfloat16"``: the forward pass runs under bfloat16 autocast (matrix
            products in bfloat16) while the weights, their gradients, AdamW's moments and the loss stay float32,
            so the saved model and RL after it are float32 as before. Faster on CPUs with bfloat16 support and on
            GPUs; a CPU without it may be slower (``benchmarks/warm_start.py``).
        evaluate: called as ``evaluate(step, weights)`` after every ``evaluate_every`` steps and after the last, with
            ``model`` in eval mode holding the last weights (``weights="last"``) and then, when ``average_decay``
            is set, their average (``"averaged"``); e.g. to play validation states (the main jobs'
            ``warm_start_eval_interval``). The training afterwards is the same to the bit as without it: the
            last weights, the train mode and the global RNG state are put back, and the batches come from their
            own generator.
        evaluate_every: steps between calls of ``evaluate``; 0 calls it only after the last step.
        micro_batch_size: rows per forward and backward pass, their gradients summed into the step's (each row's
            loss divided by the whole batch's reply tokens): the same step in less memory, as a model's activations
            grow with the rows of a pass (SmolLM2 on 16 FrozenLake demonstrations: about 15 GiB at once). 0: the
            whole batch in one pass.
        lora_rank: 0 trains every weight. ``r > 0`` trains rank-``r`` LoRA adapters on every linear layer (alpha
            ``2r``, as ``model_config["lora"]``'s defaults) and folds them into the weights after the last step,
            leaving ``model`` a plain model again: the frozen weights need no gradients and no AdamW moments
            (SmolLM2-135M: 1.6 GB of 2.2 GB), and their backward pass computes no weight gradients. Needs ``peft``.
        freeze_embeddings: keep the token embeddings and the LM head as they are (SmolLM2 ties the two: 28M of its
            135M weights): a model that already reads text learns the reply format in its other layers, and the
            step keeps no gradients or AdamW moments for them and computes neither the head's weight gradient nor
            the embedding's dense one (SmolLM2's warm start: about 0.5 GiB less at its peak; the Benchmarks page).
        progress: called after every step with the steps done and that step's loss.

    Returns:
        The loss of every step (mean over reply tokens).
    """
    if not demonstrations:
        raise ValueError("supervised_warm_start needs at least one demonstration.")
    if not 0.0 <= average_decay < 1.0:
        raise ValueError(
            f"average_decay={average_decay!r} must be in [0, 1): 0 keeps the last weights, 0.98 "
            f"averages over about the last 50 steps."
        )
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule={lr_schedule!r}: choose one of {list(LR_SCHEDULES)}.")
    if precision not in WARM_START_PRECISIONS:
        raise ValueError(f"precision={precision!r}: choose one of {list(WARM_START_PRECISIONS)}.")
    if evaluate_every < 0:
        raise ValueError(f"evaluate_every={evaluate_every!r} must be >= 0 (0: evaluate after the last step only).")
    if micro_batch_size < 0:
        raise ValueError(f"micro_batch_size={micro_batch_size!r} must be >= 0 (0: the whole batch in one pass).")
    if lora_rank < 0:
        raise ValueError(f"lora_rank={lora_rank!r} must be >= 0 (0: train every weight).")
    device = next(model.parameters()).device
    if precision == "bfloat16" and emulated_bfloat16(device):
        logger.warning(
            "warm start: precision 'bfloat16' on this CPU (no AVX512-BF16 or AMX) runs emulated, far "
            "slower than 'float32' (--warm-start-precision float32), which trains the same float32 "
            "model"
        )
    generator = torch.Generator().manual_seed(seed)
    # peft injects the adapters into model's own layers and freezes the rest; merge_and_unload puts plain layers back.
    trains = {p: p.requires_grad for p in model.parameters()}
    adapted = attach_lora(model, {**LORA_DEFAULTS, "r": lora_rank, "alpha": 2 * lora_rank}, seed) if lora_rank else None
    if freeze_embeddings:
        for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
            for p in layer.parameters() if layer is not None else ():
                p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
    model.train()
    losses, t0 = [], time.perf_counter()
    # With a context window each demonstrated turn is its own row, as in RL: the prompt it read and its reply.
    demonstrations = [row for t in demonstrations for row in t.rows]
    batches = demonstration_batches([len(t.token_ids) for t in demonstrations], batch_size, generator, group_by_length)
    # The learning rate of step k is lr * factor(k); LambdaLR sets it before each step.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warm_start_lr(1.0, step, steps, lr_schedule))
    params = list(model.parameters())
    averaged = None
    if average_decay > 0:  # EMA of the weights, starting from the weights before the first step
        average = torch.optim.swa_utils.AveragedModel(
            model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(average_decay)
        )
        average.update_parameters(model)
        averaged = list(average.module.parameters())
    trunk, head = model.get_decoder(), model.get_output_embeddings()
    for step in range(steps):
        batch = pad_trajectories([demonstrations[i] for i in next(batches)], pad_token_id)
        ids, attention, mask = (
            torch.from_numpy(batch[key]).to(device) for key in ("input_ids", "attention_mask", "response_mask")
        )
        tokens = mask.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=device)
        # The system prompt once per step, for all its passes; the LM head and its float32 log-softmax on the reply
        # tokens only.
        passes = _micro_batches(len(ids), micro_batch_size)
        with prefix_read_once(ids, attention) if len(passes) > 1 else contextlib.nullcontext() as prefix:
            for rows in passes:
                part_ids, part_attention, part_mask = ids[rows], attention[rows], mask[rows]
                width = int(part_attention.sum(-1).max())  # right-padded: no row of this pass needs more columns
                part_ids, part_attention, part_mask = (t[:, :width] for t in (part_ids, part_attention, part_mask))
                with _autocast(device, precision):
                    hidden = forward_sharing_prefix(trunk, part_ids, part_attention, prefix=prefix)
                    logp = scored_token_logprobs(hidden["last_hidden_state"], head, part_ids, part_mask)
                # Cross-entropy on the reply tokens: -log pi(x_t | x_<t), averaged over every reply token of the batch.
                part_loss = -(logp * part_mask).sum() / tokens
                if not math.isfinite(part_loss.item()):  # before backward: a non-finite loss never reaches the weights
                    raise FloatingPointError(
                        f"warm-start loss became {part_loss.item()} at step {step}; lower lr={lr}."
                    )
                part_loss.backward()
                loss = loss + part_loss.detach()
        losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        scheduler.step()
        # Each step's activations differ in size (batches of other lengths): without a trim glibc keeps the freed
        # pages between them, and a SmolLM2 warm start's resident memory crept up by gigabytes over 75 steps.
        trim_heap()
        if averaged is not None:
            average.update_parameters(model)
        if progress is not None:
            progress(step + 1, losses[-1])
        if log_every and (step + 1) % log_every == 0:
            logger.info(
                "warm start step %d/%d: loss %.4f (%.1f s)", step + 1, steps, losses[-1], time.perf_counter() - t0
            )
        if evaluate is not None and (step + 1 == steps or (evaluate_every and (step + 1) % evaluate_every == 0)):
            _evaluate_weights(model, params, averaged, evaluate, step + 1)
    if averaged is not None:
        _load(params, averaged)
    if adapted is not None:
        adapted.merge_and_unload()  # W += scale * B @ A in model's own float32 layers
    for p, flag in trains.items():  # the model's own weights train again as before (RL decides what it trains)
        p.requires_grad_(flag)
    model.eval()
    return losses


def _micro_batches(size: int, micro_batch_size: int) -> list[slice]:
    """The rows of each pass of a batch of ``size`` rows: ``micro_batch_size`` at a time (0: all at once)."""
    step = micro_batch_size or size
    return [slice(start, start + step) for start in range(0, size, step)]


@torch.no_grad()
def _load(params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    for p, value in zip(params, values):
        p.copy_(value)


def _evaluate_weights(
    model: torch.nn.Module,
    params: list[torch.Tensor],
    averaged: list[torch.Tensor] | None,
    evaluate: Callable[[int, str], None],
    step: int,
) -> None:
    """``evaluate(step, "last")`` and, with averaging, ``evaluate(step, "averaged")``; then the last weights and
    train mode again."""
    device = params[0].device
    # A forked RNG: whatever the callable draws, the training after it draws what it would have drawn without it.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.eval()
        evaluate(step, "last")
        if averaged is not None:
            last = [p.detach().clone() for p in params]
            _load(params, averaged)
            evaluate(step, "averaged")
            _load(params, last)
    model.train()
