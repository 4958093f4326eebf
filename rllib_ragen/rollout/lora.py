"""LoRA adapters on a policy, with ``peft``: attach them, merge them into plain weights, and write them for vLLM.

``model_config["lora"] = {"r": 16, "alpha": 32, "target_modules": "all-linear"}`` makes the learner train
low-rank adapters only; the base weights stay frozen. What leaves the learner depends on who needs it:

- the HF backend and ``export_pretrained`` get :func:`merged_policy_state`, plain Hugging Face weights with the
  adapters folded in, so rollouts sample at the base model's speed and the export loads without peft;
- vLLM engines get :func:`adapter_files`, the adapter alone (``r * (d_in + d_out)`` numbers per layer), which
  they serve through vLLM's LoRA support on top of the unchanged base weights;
- checkpoints hold only the adapters (and a critic), since the base is rebuilt from ``model_config``.

``"base_dtype": "bfloat16"`` stores the frozen weights under the adapters in bfloat16, for a learner whose passes run
under bfloat16 autocast (``autocast_dtype``): autocast would cast them to bfloat16 at every product anyway, and kept
that copy for the backward pass, so storing them so gives the same products to the bit in less memory and without
the casts (SmolLM2-135M: 0.27 GB of weights, and about 0.46 GB held per forward pass). The adapters stay in the
model's dtype, and the merged weights are computed and given in it.

Adapter dropout is fixed at 0: RLlib's ``forward_train`` runs in ``train()`` mode, and a sampled dropout mask
would make the learner's first ratio differ from 1.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from typing import Any

import torch

ADAPTER_NAME = "default"  # peft's name for a model's single adapter
LORA_KEYS = {"r": int, "alpha": (int, float), "target_modules": (str, list, tuple), "base_dtype": (str, type(None))}
LORA_DEFAULTS = {"r": 16, "alpha": 32, "target_modules": "all-linear", "base_dtype": None}
BASE_DTYPES = ("float32", "bfloat16")  # base_dtype's choices (None: the model's own dtype)
PEFT_MISSING = "model_config['lora'] needs peft: pip install 'rllib_ragen[lora]' (or pip install 'peft>=0.17')."


def peft_available() -> bool:
    return importlib.util.find_spec("peft") is not None


def lora_settings(lora: dict[str, Any] | None) -> dict[str, Any] | None:
    """``model_config["lora"]`` with its defaults filled in, or None when LoRA is off (None or ``{}`` is off:
    use ``{"r": 16}`` for the defaults).

    Raises:
        ValueError: an unknown key, a value of the wrong type, or a non-positive rank or alpha, named.
    """
    if not lora:
        return None
    if not isinstance(lora, dict):
        raise ValueError(f"model_config['lora'] must be a dict such as {LORA_DEFAULTS}, got {lora!r}.")
    unknown = sorted(set(lora) - set(LORA_KEYS))
    if unknown:
        raise ValueError(
            f"model_config['lora'] has unknown keys {unknown}; it takes {sorted(LORA_KEYS)} "
            "(adapter dropout is fixed at 0 so that the learner's first ratio is exactly 1)."
        )
    settings = {**LORA_DEFAULTS, **lora}
    for key, types in LORA_KEYS.items():
        value = settings[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise ValueError(
                f"model_config['lora'][{key!r}] = {value!r} has the wrong type; the default is {LORA_DEFAULTS[key]!r}."
            )
    if settings["r"] < 1 or not math.isfinite(settings["alpha"]) or settings["alpha"] <= 0:
        raise ValueError(
            f"model_config['lora'] needs r >= 1 and a finite alpha > 0, got r={settings['r']}, "
            f"alpha={settings['alpha']}."
        )
    if settings["base_dtype"] not in (None, *BASE_DTYPES):
        raise ValueError(
            f"model_config['lora']['base_dtype']={settings['base_dtype']!r}: choose one of "
            f"{list(BASE_DTYPES)}, or None for the model's own dtype."
        )
    if isinstance(settings["target_modules"], tuple):
        settings["target_modules"] = list(settings["target_modules"])
    return settings


def attach_lora(policy: torch.nn.Module, settings: dict[str, Any], seed: int = 0):
    """``policy`` wrapped as a peft model with fresh adapters: only they require gradients.

    The adapters' ``A`` matrices are drawn from ``seed`` without touching the caller's RNG (``B`` starts at zero,
    so the wrapped policy computes exactly what the base computed). ``settings["base_dtype"]`` recasts the frozen
    weights of the layers that carry adapters (module docstring).
    """
    if not peft_available():
        raise ImportError(PEFT_MISSING)
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings["r"],
        lora_alpha=settings["alpha"],
        target_modules=settings["target_modules"],
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = get_peft_model(policy, config)
    if settings.get("base_dtype"):
        from peft.tuners.lora import LoraLayer

        dtype = getattr(torch, settings["base_dtype"])
        for module in wrapped.modules():
            if isinstance(module, LoraLayer):
                module.get_base_layer().to(dtype)
    return wrapped


def is_adapter_key(key: str) -> bool:
    return ".lora_" in key


class MergedWeights(Mapping):
    """The policy's weights with each adapter folded into its layer (``W + scale * B @ A``), under the base model's
    own Hugging Face names, in the model's dtype (that of its embeddings: frozen weights stored in another,
    ``base_dtype``, are merged in it). A merged weight is computed when it is read, so a reader that copies them
    one by one (an in-process sampler's sync) holds one at a time, not a float32 copy of every adapted layer. The peft
    model is left as it is (no in-place merge and unmerge, whose float rounding would drift the base weights)."""

    def __init__(self, peft_policy):
        from peft.tuners.lora import LoraLayer

        model = peft_policy.get_base_model()
        self._dtype = model.get_input_embeddings().weight.dtype
        self._layers = {
            f"{name}.base_layer.weight": module
            for name, module in model.named_modules()
            if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A
        }
        self._tensors = {key: value for key, value in model.state_dict().items() if not is_adapter_key(key)}
        self._names = {key.replace(".base_layer.", "."): key for key in self._tensors}

    def __getitem__(self, name: str) -> torch.Tensor:
        key = self._names[name]
        value = self._tensors[key]
        if key not in self._layers:
            return value
        with torch.no_grad():
            return value.to(self._dtype) + self._layers[key].get_delta_weight(ADAPTER_NAME).to(self._dtype)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def merged_policy_state(peft_policy) -> dict[str, torch.Tensor]:
    """:class:`MergedWeights`, every one computed (what an export or a remote env runner receives)."""
    return dict(MergedWeights(peft_policy))


def adapter_files(
    adapter_state: dict[str, torch.Tensor], settings: dict[str, Any], base_model: str = ""
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The adapter as peft writes it to disk (``adapter_config.json`` and ``adapter_model.safetensors``
    contents), from a learner module's adapter weights (``policy.base_model.model.<layer>.lora_A.default.weight``).

    ``target_modules`` lists the layer names the adapters actually sit on ("all-linear" resolved), which is what
    vLLM needs to match them to its own layers.
    """
    tensors, targets = {}, set()
    for key, value in adapter_state.items():
        if not is_adapter_key(key):
            continue
        name = key[len("policy.") :] if key.startswith("policy.") else key
        name = name.replace(f".{ADAPTER_NAME}.", ".")
        tensors[name] = value.detach().cpu().contiguous()
        targets.add(name.split(".lora_")[0].rsplit(".", 1)[-1])
    if not tensors:
        raise ValueError("adapter_files: the state holds no LoRA adapter weights (is model_config['lora'] set?)")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": settings["r"],
        "lora_alpha": settings["alpha"],
        "target_modules": sorted(targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "base_model_name_or_path": base_model,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    return config, tensors


def write_adapter(directory, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Write :func:`adapter_files`' output where ``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` read it."""
    import json
    import pathlib

    from safetensors.torch import save_file

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2))
