"""HFBackend's KV caches: the last batch's cache kept for the next turn's prompts (its rows matched by prefix), a
cache layer that grows in place, and the CPU's decode attention over such a buffer."""

from __future__ import annotations

import functools
from typing import Sequence

import torch


class PrefixCache:
    """KV cache of the last batch: each row's cached token ids, the cache tensors and the attention mask.

    The mask has holes (zeros) wherever a row was padded, before its prompt or after it stopped generating;
    position ids count only a row's real tokens, so every row sees exactly what a fresh, unpadded forward pass
    over its tokens would see.
    """

    def __init__(self, rows: list[list[int]], cache, mask: torch.Tensor):
        self.rows, self.cache, self.mask = rows, cache, mask

    def match(self, prompts: Sequence[Sequence[int]]) -> list[int] | None:
        """Row index whose cached ids are a prefix of each prompt (distinct rows), or None if any has none.

        The longest matching row wins: a shorter row can be a prefix of another episode's prompt too (two episodes
        of a group whose replies start alike). Identical cached rows are kept apart, each usable once.
        """
        free = self.free_rows()
        picked = []
        for prompt in prompts:
            hit = take_row(free, prompt)
            if hit is None:
                return None
            picked.append(hit)
        return picked

    def free_rows(self) -> dict[int, dict[tuple, list[int]]]:
        """The cached rows by length, then by their ids: what :func:`take_row` takes from."""
        by_length: dict[int, dict[tuple, list[int]]] = {}
        for i, row in enumerate(self.rows):
            by_length.setdefault(len(row), {}).setdefault(tuple(row), []).append(i)
        return by_length


def take_row(free: dict[int, dict[tuple, list[int]]], prompt: Sequence[int]) -> int | None:
    """Take from ``free`` (:meth:`PrefixCache.free_rows`) the longest cached row that is a prefix of ``prompt``;
    its index, or None."""
    for n, table in sorted(free.items(), reverse=True):
        rows = table.get(tuple(prompt[:n])) if n <= len(prompt) else None
        if rows:
            return rows.pop(0)
    return None


@functools.cache
def growing_kv_layer():
    """The class of a KV-cache layer whose keys and values live in a buffer with room to grow, written in place.

    Hugging Face's ``DynamicLayer`` appends each decode step with ``torch.cat``, copying the whole cache every step:
    on ten-turn Sokoban episodes (~1,600 tokens) that copying was 40% of generation time. This layer writes a step's
    keys and values after those already held, exposes ``keys``/``values`` as views of the filled part, and grows its
    buffer by half when full: the same numbers as ``DynamicLayer`` (tested), about a third less time. Built on first
    use so that importing the backend does not import transformers.
    """
    from transformers.cache_utils import DynamicLayer

    class GrowingKVLayer(DynamicLayer):
        # A decode step (one new token per row) gets the whole buffer, not a view of its filled part, where the
        # model's attention takes it (HFBackend's CPU decode attention masks the empty slots, which hold zeros):
        # torch's bfloat16 products copy such a view (its rows apart by the buffer's capacity) every step, several
        # times slower than reading the contiguous buffer.
        whole_buffer_for_decode = False
        # Such a step reads every slot, filled or not, so a buffer read whole is sized to its call: the length a call
        # will reach (``reserve``), not half as much again.
        _call_end: int | None = None

        def reserve(self, slots: int) -> None:
            """Room for ``slots`` more tokens in this call (its prompts' new tokens and its decode steps): a buffer
            read whole at each decode step that must grow is grown to that length, not by half as much again."""
            if self.whole_buffer_for_decode:
                self._call_end = self.get_seq_length() + slots

        def _capacity(self, needed: int) -> int:
            if self._call_end is not None and self._call_end >= needed:
                return self._call_end
            return needed + max(needed // 2, GROWTH_SLOTS)

        def lazy_initialization(self, key_states, value_states):
            super().lazy_initialization(key_states, value_states)
            self._keys = self._values = None
            self._length = 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, end = self._length, self._length + key_states.shape[-2]
            if self._keys is None or end > self._keys.shape[-2]:
                capacity = self._capacity(end)
                self._keys = _grown(self._keys, key_states, start, capacity)
                self._values = _grown(self._values, value_states, start, capacity)
            self._keys[..., start:end, :] = key_states
            self._values[..., start:end, :] = value_states
            self._length = end
            self._expose()
            if self.whole_buffer_for_decode and key_states.shape[-2] == 1:
                return self._keys, self._values
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._length if self.is_initialized else 0

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
            if self.get_seq_length() > 0:
                self._length = max(0, self._length + tokens_to_remove)
                self._expose()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.get_seq_length() > 0:
                if len(indices) == self._keys.shape[0] and bool(
                    (indices == torch.arange(len(indices), device=indices.device)).all()
                ):
                    return  # the same rows in the same order: nothing to copy
                # A copy anyway: of the filled part and room for the call (GROWTH_SLOTS where it reserved none), not
                # the whole buffer.
                held, reserved = self._keys.shape[-2], self._call_end
                fits = reserved is not None and reserved >= self._length  # a call that wrote past it grew as before
                capacity = reserved if fits else min(self._length + GROWTH_SLOTS, held)
                if capacity <= held:
                    self._keys, self._values = self._keys[indices, :, :capacity], self._values[indices, :, :capacity]
                else:
                    filled = self._length
                    self._keys = _grown(self._keys[indices, :, :filled], self._keys, filled, capacity)
                    self._values = _grown(self._values[indices, :, :filled], self._values, filled, capacity)
                self._expose()

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.get_seq_length() > 0:
                self._keys = self._keys.repeat_interleave(repeats, dim=0)
                self._values = self._values.repeat_interleave(repeats, dim=0)
                self._expose()

        def _expose(self):
            self.keys = self._keys[..., : self._length, :]
            self.values = self._values[..., : self._length, :]

    return GrowingKVLayer


# Slots a KV buffer keeps beyond what it holds, at least: room for a turn's new tokens without growing.
GROWTH_SLOTS = 128


def _grown(buffer: torch.Tensor | None, like: torch.Tensor, filled: int, capacity: int) -> torch.Tensor:
    """A (B, H, capacity, D) buffer (B, H and D those of ``buffer``, or of ``like`` where there is none yet) holding
    ``buffer``'s first ``filled`` slots, and zeros after them (a decode attention over the whole buffer reads them,
    masked)."""
    batch, heads, _, dim = (buffer if buffer is not None else like).shape
    grown = like.new_zeros(batch, heads, capacity, dim)
    if filled:
        grown[..., :filled, :] = buffer[..., :filled, :]
    return grown


# The attention HFBackend sets on a CPU model (registered with transformers' AttentionInterface on first use): a
# decode step's one query per row attends by two batched products, every query head of a key/value group at once;
# longer queries (a prefill) go to SDPA as before. Hugging Face hands torch's SDPA the query heads of a group as a
# query of a few tokens, and its CPU kernel, built for long queries, took most of a decode step (docs/benchmarks.md,
# "The CPU's limit").
CPU_DECODE_ATTENTION = "rllib_ragen_cpu_decode"


def _decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of (B, H, q, D) queries over (B, KVH, T, D) keys and values; q = 1 here, else SDPA's.

    The query heads that share a key/value head (Hugging Face's ``repeat_kv`` order: head ``j * G + g`` reads
    key/value head ``j``) are one (G, D) block, multiplied with that head's keys without copying them. The mask is
    SDPA's (boolean, True to attend, or additive); softmax in float32."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, length, dim = query.shape
    if length != 1 or kwargs.get("softcap") is not None or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = key.shape[1]
    q = query.reshape(batch, groups, heads // groups, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).float().mul_(scaling if scaling is not None else dim**-0.5)
    if attention_mask is not None:
        scores.add_(slot_bias(attention_mask, key.shape[2]))
    probs = torch.softmax(scores, -1).to(value.dtype)
    out = torch.matmul(probs, value)  # (B, KVH, G, D)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2), None


# The last decode step's mask and its bias: transformers hands every layer of one forward pass the same mask tensor,
# so the first layer builds the bias and the other layers add it (kept with a reference to the mask, whose identity is
# the key: a later pass's new mask cannot be taken for it).
_last_bias: tuple = (None, None)


def slot_bias(attention_mask: torch.Tensor, slots: int) -> torch.Tensor:
    """(B, 1, 1, slots) float32 additive mask of a decode step's one query over a cache buffer of ``slots``: 0 where
    SDPA's mask (boolean, True to attend, or additive; (B, 1, q, filled)) lets its last query attend, -inf where it
    does not and over the empty slots past the filled ones."""
    global _last_bias
    seen, bias = _last_bias
    if seen is attention_mask and bias.shape[-1] == slots:
        return bias
    row = attention_mask[:, :, -1:, :]
    empty = slots - row.shape[-1]
    if row.dtype == torch.bool:
        attend = torch.nn.functional.pad(row, (0, empty), value=False)
        bias = torch.zeros(attend.shape, dtype=torch.float32, device=row.device).masked_fill_(~attend, float("-inf"))
    else:
        bias = torch.nn.functional.pad(row.float(), (0, empty), value=float("-inf"))
    _last_bias = (attention_mask, bias)
    return bias


@functools.cache
def register_decode_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def mask_never_skipped(*args, **kwargs):
        # SDPA's mask, always built: transformers leaves it out where every token is seen, but a decode step over a
        # whole cache buffer must mask its empty slots.
        return sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})

    AttentionInterface.register(CPU_DECODE_ATTENTION, _decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CPU_DECODE_ATTENTION, mask_never_skipped)
    return CPU_DECODE_ATTENTION


def new_cache(model, whole_buffer_for_decode: bool = False):
    """An empty KV cache for ``model``: growing in place where every layer is plain full attention (the layers
    Hugging Face builds for sliding windows or recurrent state are kept as they are); ``whole_buffer_for_decode``:
    see ``GrowingKVLayer``."""
    from transformers import DynamicCache

    from rllib_ragen.rollout.models import full_attention_cache

    cache = full_attention_cache(model)
    if cache is None:
        return DynamicCache(config=model.config)
    cache.layers = [growing_kv_layer()() for _ in cache.layers]
    for layer in cache.layers:
        layer.whole_buffer_for_decode = whole_buffer_for_decode
    return cache


def reserve(cache, slots: int) -> None:
    """Room for ``slots`` more tokens in each growing layer of ``cache`` for the coming call
    (``GrowingKVLayer.reserve``; other layers grow as Hugging Face's do)."""
    for layer in cache.layers:
        if hasattr(layer, "reserve"):
            layer.reserve(slots)
