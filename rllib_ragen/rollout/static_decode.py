"""Decoding on a static KV cache, with each decode step captured once as a CUDA graph and replayed.

A decode step of a small model on a GPU is launch-bound: eager PyTorch issues hundreds of small kernels per step,
each costing more to launch than its arithmetic takes. Replaying the step as one CUDA graph removes the launches. A
graph needs fixed shapes and fixed addresses, so the cache here is a :class:`StaticSlab`: Hugging Face's
``StaticCache`` (keys and values of ``(rows, heads, columns, dim)``, written at a column index that lives on the
device) plus a ``valid`` mask of the columns each row really holds.

How rows stay exact: every call writes one column block for all rows at once. A row with fewer new tokens than the
widest is left-padded with holes (``valid`` False), and a row that stopped generating is fed a hole each step, so a
row's attention sees exactly its own tokens. Position ids count a row's valid columns, as in a fresh unpadded
forward pass. Attention goes through the model's own forward with a prepared 4D mask (Hugging Face uses such a
mask as it is), so the arithmetic is the model's own: the recorded log-probs equal a fresh forward pass (tested).

Rows are reordered in place between turns (the next turn's prompts extend some of the slab's rows, in another
order); rows not in a call are parked: fed holes, their columns masked. The slab is kept and reused, with its
graph, while calls fit its shape; one that does not gets a new slab (a full prefill of its prompts).
"""

from __future__ import annotations

import logging
import math

import torch

from .models import takes_logits_to_keep

logger = logging.getLogger(__name__)

ROW_BUCKET = 8  # slabs round their rows up to this, so rollouts of nearly the same size share one slab and graph
COLUMN_BUCKET = 256  # and their columns


def _round_up(value: int, bucket: int) -> int:
    return max(bucket, int(math.ceil(value / bucket)) * bucket)


class StaticSlab:
    """A static KV cache of ``rows`` x ``columns`` for one model, with its decode-step CUDA graph.

    Args:
        model: a causal LM whose layers are all plain full attention (``models.full_attention_cache`` is not None).
        rows, columns: the cache's shape (rows of the batch, token columns).
        cuda_graphs: capture the one-token step as a CUDA graph on first use (CUDA devices only).
    """

    def __init__(self, model, rows: int, columns: int, cuda_graphs: bool):
        from transformers import StaticCache

        self.model, self.rows, self.columns = model, rows, columns
        self.device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=columns)
        self.valid = torch.zeros((rows, columns), dtype=torch.bool, device=self.device)
        self.column = 0  # the next column to write (a host-side copy of the layers' device counters)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self._graph = None
        self._static: dict[str, torch.Tensor] = {}
        self._arange = torch.arange(columns, device=self.device)
        self._keeps_logits = takes_logits_to_keep(model)
        self.graph_failures = 0

    # ---- state ---------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty every row (a new batch of prompts); buffers and the graph are kept."""
        self.valid.zero_()
        self._set_column(0)

    def _set_column(self, column: int) -> None:
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.fill_(column)
        self.column = column

    def fits(self, rows: int, new_columns: int) -> bool:
        return rows <= self.rows and self.column + new_columns <= self.columns

    def reorder(self, index: list[int]) -> None:
        """Row i takes what row ``index[i]`` held; rows from ``len(index)`` on are parked (emptied)."""
        order = torch.tensor(list(index) + [0] * (self.rows - len(index)), device=self.device)
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys.copy_(layer.keys[order])
                layer.values.copy_(layer.values[order])
        self.valid.copy_(self.valid[order])
        self.valid[len(index) :] = False

    # ---- feeding tokens ------------------------------------------------------------------------------------------
    def feed(self, ids: list[list[int]], pad_token_id: int) -> torch.Tensor:
        """Write each row's new ids (rows beyond ``len(ids)``, and empty lists, get holes) at the next columns;
        returns the (len(ids), vocab) float logits after each row's last real token (rows fed nothing: garbage)."""
        width = max(1, max(len(r) for r in ids))
        if self.column + width > self.columns:
            raise RuntimeError(
                f"the static KV cache has {self.columns - self.column} columns left; {width} asked "
                "(the backend sizes slabs before feeding: a bug)."
            )
        new_ids = torch.full((self.rows, width), pad_token_id, dtype=torch.long)
        new_valid = torch.zeros((self.rows, width), dtype=torch.bool)
        for row, tokens in enumerate(ids):
            if tokens:
                new_ids[row, width - len(tokens) :] = torch.tensor(tokens)
                new_valid[row, width - len(tokens) :] = True
        new_ids, new_valid = new_ids.to(self.device), new_valid.to(self.device)
        if width == 1 and self.cuda_graphs and self.graph_failures == 0:
            logits = self._replay(new_ids, new_valid[:, 0])
        else:
            logits = self._step(new_ids, new_valid)
        self.column += width
        return logits[: len(ids)]

    def _step(self, new_ids: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
        """One forward pass over a (rows, width) block at columns [column, column + width), eagerly or in capture.

        Reads the write column from the cache's device counter only when capturing (``_column_tensor``), so that the
        same recorded graph writes at the right column on every replay.
        """
        width = new_ids.shape[1]
        start = self._column_tensor()
        columns = start + torch.arange(width, device=self.device)  # (width,) the columns written
        self.valid.index_copy_(1, columns, new_valid)
        position_ids = self.valid[:, :].long().cumsum(-1).gather(1, columns.expand(self.rows, width)) - 1
        position_ids = position_ids.clamp(min=0)
        # A query at column c sees the valid columns up to c, and itself (a hole's query must see something, or its
        # softmax is 0/0: its output is never used, but a NaN key or value would poison the rows that mask it).
        seen = self.valid[:, None, :] & (self._arange[None, None, :] <= columns[None, :, None])
        seen = seen | (self._arange[None, None, :] == columns[None, :, None])
        from .models import cache_argument

        kwargs = {"logits_to_keep": 1} if self._keeps_logits else {}
        out = self.model(
            input_ids=new_ids,
            attention_mask=seen[:, None],
            position_ids=position_ids,
            **{cache_argument(): self.cache},
            use_cache=True,
            **kwargs,
        )
        return out.logits[:, -1].float()

    def _column_tensor(self) -> torch.Tensor:
        layer = self.cache.layers[0]
        if layer.is_initialized:
            return layer.cumulative_length.to(self.device).reshape(())
        return torch.tensor(self.column, device=self.device)

    # ---- CUDA graphs -----------------------------------------------------------------------------------------------
    def _replay(self, new_ids: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
        if self._graph is None:
            try:
                self._capture(new_ids, new_valid)
            except Exception as error:  # correct without the graph, only slower: say so, count it, go on eagerly
                self.graph_failures += 1
                self._graph = None
                logger.warning(
                    "capturing the decode step as a CUDA graph failed (%r): this slab decodes eagerly.", error
                )
                return self._step(new_ids, new_valid[:, None])
        self._static["ids"].copy_(new_ids)
        self._static["valid"].copy_(new_valid)
        self._graph.replay()  # it advances the layers' device counters; feed() moves the host copy
        return self._static["logits"]

    def _capture(self, new_ids: torch.Tensor, new_valid: torch.Tensor) -> None:
        """Record one decode step. The warm-up runs write a column; counters, mask and that column's keys and values
        are put back afterwards, whether the capture worked or not."""
        column, valid = self.column, self.valid.clone()
        layers = [layer for layer in self.cache.layers if layer.is_initialized]
        saved = [(layer.keys[..., column, :].clone(), layer.values[..., column, :].clone()) for layer in layers]
        self._static = {"ids": new_ids.clone(), "valid": new_valid.clone()}
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up kernels and allocator outside the capture, at the same column
                    self._set_column(column)
                    self._step(self._static["ids"], self._static["valid"][:, None])
            torch.cuda.current_stream().wait_stream(stream)
            self._set_column(column)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._static["logits"] = self._step(self._static["ids"], self._static["valid"][:, None])
            self._graph = graph
        finally:
            self._set_column(column)
            self.valid.copy_(valid)
            for layer, (keys, values) in zip(layers, saved):
                layer.keys[..., column, :] = keys
                layer.values[..., column, :] = values


def slab_shape(rows: int, columns: int) -> tuple[int, int]:
    """The bucketed shape of a slab for ``rows`` prompts and ``columns`` token columns."""
    return _round_up(rows, ROW_BUCKET), _round_up(columns, COLUMN_BUCKET)
