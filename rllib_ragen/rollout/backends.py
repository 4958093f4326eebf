"""Inference backends: token ids in, sampled token ids and their log-probs out.

The interface is deliberately small so that a vLLM engine can implement it too:
``generate(prompts, params, seed, max_new_tokens) -> list[Generation]`` and ``load_weights(state_dict)``.
``max_new_tokens`` is an optional per-prompt cap below ``params.max_new_tokens``: the rollout engine passes the
room each conversation has left under ``max_context_tokens``.

Log-probs are ``log_softmax(raw_logits / temperature)`` of the sampled token, the quantity the learner
recomputes. Top-p/top-k truncation changes what is sampled but not this formula, so leave them off (the
defaults) when the ratio at the first update must be exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from .kv_cache import CPU_DECODE_ATTENTION, PrefixCache, new_cache, register_decode_attention, reserve, take_row


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn's reply.

    Attributes:
        temperature: softmax temperature; 0 means greedy (log-probs are then taken at temperature 1).
        top_p, top_k: nucleus / top-k truncation (1.0 and 0 switch them off).
        max_new_tokens: reply length limit; a reply cut by it usually fails the format.
        stop_strings: generation of a reply ends once its text contains one of these.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 400
    stop_strings: tuple[str, ...] = ("</answer>",)


@dataclass
class Generation:
    """One sampled reply: its token ids (end-of-turn token included when sampled) and their log-probs."""

    token_ids: list[int]
    logprobs: list[float]


class InferenceBackend(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...

    # Optional: ``conversations_ended()``, called by the rollout engine when every conversation it was playing has
    # ended (a wave, a rollout); a backend that keeps per-conversation state (HFBackend's KV caches) drops it there.


# How HFBackend decodes: "growing" (a KV cache grown in place, the CPU's fastest), "static" (a static KV cache, each
# decode step a CUDA graph on a GPU: static_decode.py), "auto" (static on a CUDA device, else growing).
DECODE_PATHS = ("auto", "static", "growing")


class HFBackend:
    """Batched KV-cached sampling with any Hugging Face causal LM, in the calling process (CPU or GPU).

    Prompts are left-padded into one batch. Between calls the KV cache is kept: when every prompt of a call
    extends a sequence of the previous call (the next turn of the same conversations), only the new tokens are
    fed to the model instead of re-reading the whole history (prefix caching). ``load_weights`` drops the cache.

    Args:
        model: a causal LM in eval mode.
        tokenizer: its tokenizer (pad and eos tokens set).
        max_batch_size: prompts per batch; larger calls are split (each split keeps its own cache).
        prefix_cache: reuse the KV cache across calls.
    """

    def __init__(self, model, tokenizer, max_batch_size: int = 128, prefix_cache: bool = True, decode: str = "auto"):
        from .models import full_attention_cache, takes_logits_to_keep

        if decode not in DECODE_PATHS:
            raise ValueError(f"decode={decode!r}: choose one of {DECODE_PATHS}.")
        self.model, self.tokenizer, self.max_batch_size = model, tokenizer, max_batch_size
        self.prefix_cache = prefix_cache
        self.device = next(model.parameters()).device
        static_fits = full_attention_cache(model) is not None
        if decode == "static" and not static_fits:
            raise ValueError(
                f"decode='static' needs a model whose layers are all plain full attention; "
                f"{type(model).__name__} has others (sliding windows or recurrent state): use 'growing'."
            )
        if decode == "auto":  # by device: the static cache and CUDA graphs pay on a GPU, the growing cache on a CPU
            decode = "static" if self.device.type == "cuda" and static_fits else "growing"
        self.decode = decode
        self.cuda_graphs = decode == "static" and self.device.type == "cuda"
        # SDPA, or ours already: a second backend on the same model (an evaluation's beside the sampler's) too.
        attention = getattr(model.config, "_attn_implementation", None)
        self._cpu_attention = self.device.type == "cpu" and attention in ("sdpa", CPU_DECODE_ATTENTION)
        if self._cpu_attention:
            model.set_attn_implementation(register_decode_attention())
        # bfloat16 products copy a strided view of the cache; float32 ones read it where it lies, and faster than
        # the larger whole buffer (docs/benchmarks.md).
        self._whole_buffer = self._cpu_attention and self.model.dtype == torch.bfloat16
        self._keeps_logits = takes_logits_to_keep(model)
        self._caches: dict[int, PrefixCache] = {}
        self._slabs: dict = {}
        self._parameter_addresses = self._addresses()
        self._token_texts: dict[int, str] = {}
        self.stats = {"prompt_tokens": 0, "prefilled_tokens": 0}

    def _addresses(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.model.parameters())

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict)
        self.weights_changed()

    def conversations_ended(self) -> None:
        """Every conversation the caches hold has ended (the rollout engine's wave or rollout is over): drop them,
        rather than keep them through the learner's update until the next weight sync."""
        for chunk in list(self._caches):
            self._drop_cache(chunk)

    def weights_changed(self) -> None:
        """The model's weights changed in place (a learner sharing its tensors stepped): drop the KV cache, whose
        keys and values belong to the old weights. A captured CUDA graph reads the weights at the addresses it was
        recorded with: where the parameters now live elsewhere (re-shared), the slabs and their graphs go too."""
        for cached in self._caches.values():
            if self.decode == "static":
                self._free_slab(cached.cache)
        self._caches.clear()
        addresses = self._addresses()
        if addresses != self._parameter_addresses:
            self._slabs.clear()
            self._parameter_addresses = addresses

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, ())))
        caps = reply_caps(params, len(prompts), max_new_tokens)
        out: list[Generation | None] = [None] * len(prompts)
        for chunk, rows in self._chunks(prompts):
            generations = self._generate_batch(
                chunk, [list(prompts[r]) for r in rows], params, [caps[r] for r in rows], generator
            )
            for row, generation in zip(rows, generations):
                out[row] = generation
        return out

    def _chunks(self, prompts: Sequence[Sequence[int]]) -> list[tuple[int, list[int]]]:
        """The batches of a call, as (chunk, prompt indices), each of at most ``max_batch_size`` prompts with a KV
        cache of its own. When every prompt continues a conversation a chunk's cache holds, it goes to that chunk
        (episodes that ended leave the others in their chunks; cut into consecutive slices, a later episode would
        land in a chunk that does not hold it and every chunk would read its whole history again); otherwise
        consecutive slices, read afresh."""
        owners = self._cache_owners(prompts) if self.prefix_cache and len(self._caches) > 1 else None
        if owners is None:
            return [
                (chunk, list(range(start, min(start + self.max_batch_size, len(prompts)))))
                for chunk, start in enumerate(range(0, len(prompts), self.max_batch_size))
            ]
        by_chunk: dict[int, list[int]] = {}
        for row, chunk in enumerate(owners):
            by_chunk.setdefault(chunk, []).append(row)
        for chunk in set(self._caches) - set(by_chunk):  # every conversation it held has ended
            self._drop_cache(chunk)
        return sorted(by_chunk.items())

    def _cache_owners(self, prompts: Sequence[Sequence[int]]) -> list[int] | None:
        """The chunk whose cache holds each prompt's conversation so far (each cached row serving one prompt), or
        None when some prompt has none."""
        free = {chunk: cached.free_rows() for chunk, cached in self._caches.items()}
        owners = []
        for prompt in prompts:
            owner = next((chunk for chunk in sorted(free) if take_row(free[chunk], prompt) is not None), None)
            if owner is None:
                return None
            owners.append(owner)
        return owners

    def _drop_cache(self, chunk: int) -> None:
        cached = self._caches.pop(chunk)
        if self.decode == "static":
            self._free_slab(cached.cache)

    def _token_text(self, token: int) -> str:
        """Decoded text of one token, memoised: the stop-string check needs it for every sampled token."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode([token])
        return text

    def _forward(self, ids: list[list[int]], cache, mask: torch.Tensor | None):
        """Feed each row its new ids, left-padded to a common width (an empty row becomes a hole).

        Returns the logits at the last position (batch, vocab), the cache and the grown attention mask.
        """
        from rllib_ragen.rollout.models import cache_argument

        pad = self.tokenizer.pad_token_id
        width = max(len(r) for r in ids)
        if width == 1:  # a decode step: one token or a hole per row
            new_ids = torch.tensor([[r[0] if r else pad] for r in ids])
            new_mask = torch.tensor([[1 if r else 0] for r in ids])
        else:
            new_ids = torch.full((len(ids), width), pad, dtype=torch.long)
            new_mask = torch.zeros((len(ids), width), dtype=torch.long)
            for row, tokens in enumerate(ids):
                if tokens:
                    new_ids[row, width - len(tokens) :] = torch.tensor(tokens)
                    new_mask[row, width - len(tokens) :] = 1
        new_mask = new_mask.to(self.device)
        seen = mask.sum(-1, keepdim=True) if mask is not None else 0
        position_ids = (seen + new_mask.cumsum(-1) - 1).clamp(min=0)
        mask = new_mask if mask is None else torch.cat([mask, new_mask], dim=1)
        last_only = {"logits_to_keep": 1} if self._keeps_logits else {}
        output = self.model(
            input_ids=new_ids.to(self.device),
            attention_mask=mask,
            position_ids=position_ids,
            **{cache_argument(): cache},
            use_cache=True,
            **last_only,
        )
        return output.logits[:, -1].float(), output[cache_argument()], mask

    def _generate_batch(
        self, chunk: int, prompts: list[list[int]], params: SamplingParams, caps: list[int], generator: torch.Generator
    ) -> list[Generation]:
        if self.decode == "static":
            return self._generate_on_slab(chunk, prompts, params, caps, generator)
        previous = self._caches.pop(chunk, None) if self.prefix_cache else None
        rows = previous.match(prompts) if previous is not None else None
        if rows is None:
            previous = None  # its buffers go before the new cache's are filled, not after
            cache, mask, new = new_cache(self.model, self._whole_buffer), None, prompts
            reserve(cache, max(len(p) for p in new) + max(caps))
        else:
            new = [p[len(previous.rows[r]) :] for p, r in zip(prompts, rows)]
            reserve(previous.cache, max(len(n) for n in new) + max(caps))
            index = torch.tensor(rows, device=self.device)
            previous.cache.batch_select_indices(index)
            cache, mask = previous.cache, previous.mask[index]
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        logits, cache, mask = self._prefill(new, cache, mask)
        state = {"cache": cache, "mask": mask}

        def step(feed: list[list[int]]) -> torch.Tensor:
            logits, state["cache"], state["mask"] = self._forward(feed, state["cache"], state["mask"])
            return logits

        replies, logprobs = self._sample_replies(logits, step, params, caps, generator)
        if self.prefix_cache:
            self._caches[chunk] = PrefixCache(_cached_rows(prompts, replies), state["cache"], state["mask"])
        return [Generation(r, lp) for r, lp in zip(replies, logprobs)]

    def _prefill(self, new: list[list[int]], cache, mask):
        """:meth:`_forward` of each row's new ids, reading each distinct prompt of a fresh batch once: a GRPO group's
        episodes open with the same prompt, so the first turn prefills one row per group, and the cache rows, mask
        and logits are then repeated for the group's other episodes (as ``forward_sharing_prefix`` shares a prefix
        in the learner)."""
        distinct: dict[tuple, int] = {}
        copies = [distinct.setdefault(tuple(row), len(distinct)) for row in new]
        if mask is not None or len(distinct) == len(new):
            self.stats["prefilled_tokens"] += sum(len(n) for n in new)
            return self._forward(new, cache, mask)
        self.stats["prefilled_tokens"] += sum(len(row) for row in distinct)
        logits, cache, mask = self._forward([list(row) for row in distinct], cache, None)
        index = torch.tensor(copies, device=self.device)
        cache.batch_select_indices(index)
        return logits[index], cache, mask[index]

    def _generate_on_slab(
        self, chunk: int, prompts: list[list[int]], params: SamplingParams, caps: list[int], generator: torch.Generator
    ) -> list[Generation]:
        """:meth:`_generate_batch` on a static KV cache (``static_decode.py``), each decode step a CUDA graph
        replay on a GPU. The prefix cache works as on the growing cache: the slab's rows are reordered in place."""
        from .static_decode import StaticSlab, slab_shape

        pad = self.tokenizer.pad_token_id
        previous = self._caches.pop(chunk, None)
        rows = previous.match(prompts) if previous is not None else None
        new = [p[len(previous.rows[r]) :] for p, r in zip(prompts, rows)] if rows is not None else prompts
        if rows is not None and previous.cache.fits(len(prompts), max(len(n) for n in new) + max(caps)):
            slab = previous.cache
            slab.reorder(rows)
        else:  # a new batch, or one that no longer fits: the whole prompts on an empty slab
            if previous is not None:
                self._free_slab(previous.cache)
            new = prompts
            # Twice the room this call needs: the next turns append to the same rows (holes included).
            shape = slab_shape(len(prompts), 2 * (max(len(p) for p in prompts) + max(caps)))
            slab = self._slabs.pop(shape, None) or StaticSlab(self.model, *shape, cuda_graphs=self.cuda_graphs)
            slab.reset()
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["prefilled_tokens"] += sum(len(n) for n in new)
        failures = slab.graph_failures
        logits = slab.feed(new, pad)
        replies, logprobs = self._sample_replies(logits, lambda feed: slab.feed(feed, pad), params, caps, generator)
        self.stats["graph_failures"] = self.stats.get("graph_failures", 0) + slab.graph_failures - failures
        if self.prefix_cache:  # the slab stays this chunk's until its next call
            self._caches[chunk] = PrefixCache(_cached_rows(prompts, replies), slab, None)
        else:
            self._free_slab(slab)
        return [Generation(r, lp) for r, lp in zip(replies, logprobs)]

    def _free_slab(self, slab) -> None:
        """Keep a slab no chunk uses for the next call of its shape (buffers and graph reused); one per shape, at
        most two shapes (each holds a whole KV cache)."""
        self._slabs[(slab.rows, slab.columns)] = slab
        while len(self._slabs) > 2:
            self._slabs.pop(next(iter(self._slabs)))

    def _sample_replies(
        self, logits: torch.Tensor, step, params: SamplingParams, caps: list[int], generator: torch.Generator
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample every row's reply from the logits after its prompt: ``step(feed)`` feeds each row its new token
        (or nothing, a row that stopped) and returns the next logits. A row stops at eos, at its cap, or once its
        text holds a stop string; its last token is never fed."""
        eos, batch = self.tokenizer.eos_token_id, len(caps)
        replies: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        texts, running = [""] * batch, [True] * batch
        for _ in range(max(caps)):
            tokens, token_logprobs = _sample(logits, params, generator)
            tokens, token_logprobs = tokens.tolist(), token_logprobs.tolist()  # one device sync per step, not per row
            feed = []
            for row in range(batch):
                if not running[row]:
                    feed.append([])
                    continue
                token = tokens[row]
                replies[row].append(token)
                logprobs[row].append(token_logprobs[row])
                texts[row] = (texts[row] + self._token_text(token))[-64:]
                if token == eos or len(replies[row]) >= caps[row] or any(s in texts[row] for s in params.stop_strings):
                    running[row] = False  # its last token is never fed
                feed.append([token] if running[row] else [])
            if not any(running):
                break
            # A row that stopped is fed nothing: it gets a hole (mask 0), keeping the batch rectangular.
            logits = step(feed)
        return replies, logprobs


def _cached_rows(prompts: list[list[int]], replies: list[list[int]]) -> list[list[int]]:
    """What a KV cache holds after a call: each prompt plus its reply minus the last sampled token (never fed)."""
    return [p + r[:-1] if r else p for p, r in zip(prompts, replies)]


def reply_caps(params: SamplingParams, num_prompts: int, max_new_tokens: Sequence[int] | None) -> list[int]:
    """Each prompt's reply length limit: ``params.max_new_tokens``, lowered by a per-prompt cap where given."""
    if max_new_tokens is None:
        return [params.max_new_tokens] * num_prompts
    if len(max_new_tokens) != num_prompts or min(max_new_tokens, default=1) < 1:
        raise ValueError(
            f"max_new_tokens needs one cap >= 1 per prompt; got {list(max_new_tokens)[:8]} for {num_prompts} prompts."
        )
    return [min(int(cap), params.max_new_tokens) for cap in max_new_tokens]


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
    """Sample one token per row from (batch, vocab) raw logits.

    Returns the tokens and log_softmax(logits / T) at them (T = 1 when greedy): top-k/top-p shape what is
    sampled, never the recorded log-prob, so it equals what the learner recomputes from the same logits.
    """
    if params.temperature <= 0:
        tokens = logits.argmax(-1)
        return tokens, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    # Each full-vocabulary temporary costs a decode step a pass over batch x vocab numbers: none for T = 1.
    logprobs = torch.log_softmax(logits if params.temperature == 1.0 else logits / params.temperature, -1)
    if not params.top_k and params.top_p >= 1.0:
        tokens = _draw(logprobs.exp(), generator)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    filtered = logprobs.clone()
    if params.top_k and params.top_k < filtered.shape[-1]:
        kth = filtered.topk(params.top_k, dim=-1).values[:, -1:]
        filtered[filtered < kth] = float("-inf")
    if params.top_p < 1.0:
        ordered, order = filtered.sort(dim=-1, descending=True)
        drop = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1) > params.top_p
        filtered.scatter_(-1, order, ordered.masked_fill(drop, float("-inf")))
    tokens = _draw(filtered.softmax(-1), generator)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def _draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of (batch, vocab) probabilities (overwritten), by inverse transform: one uniform number a
    row, found in the row's cumulative sums (a token of probability 0 is never drawn). ``torch.multinomial`` draws an
    exponential number for every entry instead, which took a large share of a CPU decode step over a 49k-token
    vocabulary (docs/benchmarks.md, "The CPU's limit")."""
    cdf = probs.cumsum_(-1)  # in place: ``probs`` is the caller's temporary
    total = cdf[:, -1:]
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype) * total
    # Strictly below the total (the product can round up to it): the first sum above u then always ends on a token
    # of positive probability.
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


class ScriptedBackend:
    """Plays a Python policy through the same interface, for tests and demonstrations.

    Args:
        policy: maps the decoded prompt (the whole conversation so far) to a reply text.
        tokenizer: encodes the reply; its eos token is appended, as a model would sample it.
    """

    def __init__(self, policy: Callable[[str], str], tokenizer):
        self.policy, self.tokenizer = policy, tokenizer

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """A scripted policy has no weights; accepting them keeps training loops backend-agnostic."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[Generation]:
        out = []
        for prompt, cap in zip(prompts, reply_caps(params, len(prompts), max_new_tokens)):
            reply = self.policy(self.tokenizer.decode(prompt))
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"][: cap - 1]
            ids.append(self.tokenizer.eos_token_id)
            out.append(Generation(ids, [0.0] * len(ids)))
        return out
