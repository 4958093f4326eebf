"""The RLModule: a causal LM policy and, on learners only, its critic.

Env runners build it ``inference_only`` (the policy alone, which their inference backend samples from); learners
build the full module, whose ``forward_train`` returns per-token log-probs, entropies and (with a critic) values,
aligned to the token they score: position t holds log pi(x_t | x_<t), and V(x_<t).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.annotations import override

from ..objectives import scored_logprobs_and_entropy, token_logprobs_and_entropy
from ..objectives.losses import shift_right
from ..rollout.lora import MergedWeights, attach_lora, is_adapter_key, lora_settings, merged_policy_state
from ..rollout.models import enable_activation_checkpointing, forward_sharing_prefix, load_policy, prefix_read_once


class _DropRLModuleConfigNotice(logging.Filter):
    """RLlib 2.60's ``RLModule.__init__`` always builds the deprecated ``RLModuleConfig`` for its own bookkeeping,
    so every module, RLlib's PPO module included, logs "RLModule(config=...) has been deprecated" although it was
    built the current way (keyword arguments, as ``RLModuleSpec.build`` does). Drop that one message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "RLModule(config=[RLModuleConfig object])" not in record.getMessage()


logging.getLogger("ray._common.deprecation").addFilter(_DropRLModuleConfigNotice())

# Text policies have no gymnasium spaces of their own; RLlib's module spec insists on some.
PLACEHOLDER_SPACE = gym.spaces.Discrete(1)

CRITIC_TYPES = ("separate", "head")  # StarPOConfig.validate checks model_config["critic"] against these
DEFAULT_MODEL_CONFIG = {
    "model": "tiny",  # "tiny", "smollm2-135m", or a Hugging Face id / local path
    "dtype": "float32",  # "bfloat16" halves memory on GPU; float32 keeps rollout and learner log-probs equal
    "seed": 0,  # initialisation seed of the tiny model (ignored by pretrained models)
    # "separate": a value model whose trunk starts as a copy of the policy's (RAGEN's critic);
    # "head": a linear value head on the policy's own last hidden state (no second trunk, half the memory).
    "critic": "separate",
    # LoRA adapters ({"r": 16, "alpha": 32, "target_modules": "all-linear"}, needs peft): the learner trains them
    # alone; env runners get merged weights, vLLM engines the adapter. None trains every weight.
    "lora": None,
    # Keep each decoder layer's input only and re-run the layer in the backward pass (the policy's and the critic's):
    # an update's activations shrink to about one layer's, for about a third more forward compute; gradients
    # unchanged to the bit. (The main jobs' warm start has its own: --warm-start-activation-checkpointing.)
    "activation_checkpointing": False,
}


class ValueModel(torch.nn.Module):
    """A transformer trunk with a scalar head: V(x_<=t) for every position t."""

    def __init__(self, trunk: torch.nn.Module, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.trunk = trunk
        self.head = torch.nn.Linear(hidden_size, 1, dtype=dtype)
        torch.nn.init.zeros_(self.head.weight)  # V = 0 at the start, and no RNG draw
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = forward_sharing_prefix(self.trunk, input_ids, attention_mask)["last_hidden_state"]
        return self.head(hidden).squeeze(-1).float()


class CausalLMRLModule(TorchRLModule, InferenceOnlyAPI):
    """A Hugging Face causal LM as an RLlib module.

    ``model_config`` keys: ``model``, ``dtype``, ``seed``, ``critic``, ``lora`` (see ``DEFAULT_MODEL_CONFIG``),
    plus what the algorithm config adds itself: ``value_function`` (build a critic) and ``temperature`` (log-probs
    are those of ``softmax(logits / temperature)``, the distribution the rollout sampled from).
    """

    @override(TorchRLModule)
    def setup(self):
        cfg = {**DEFAULT_MODEL_CONFIG, **(self.model_config or {})}
        self.temperature = float(cfg.get("temperature", 1.0))
        self._prefix = None  # the prefix the passes of a prefix_read_once block share
        self.policy, self.tokenizer = load_policy(cfg["model"], dtype=cfg["dtype"], seed=int(cfg["seed"]))
        self.critic_type = cfg["critic"] if cfg.get("value_function") and not self.inference_only else None
        if self.critic_type == "separate":
            trunk = copy.deepcopy(self.policy.base_model)  # before any adapter: the critic trains its own trunk
            self.critic = ValueModel(trunk, self.policy.config.hidden_size, self.policy.dtype)
        elif self.critic_type == "head":
            self.value_head = torch.nn.Linear(self.policy.config.hidden_size, 1, dtype=self.policy.dtype)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        # Env runners (inference_only) hold the plain policy and receive merged weights: no adapter to sample with.
        self.lora = None if self.inference_only else lora_settings(cfg.get("lora"))
        if self.lora:
            self.policy = attach_lora(self.policy, self.lora, seed=int(cfg["seed"]))
        if cfg["activation_checkpointing"] and not self.inference_only:
            for model in (self.policy, getattr(self, "critic", None) and self.critic.trunk):
                if model is not None:
                    enable_activation_checkpointing(model)
                    model.train()  # Hugging Face checkpoints in train mode only; dropout is off (load_policy)

    # ---- RLlib API ----------------------------------------------------------------------------------------------
    @override(InferenceOnlyAPI)
    def get_non_inference_attributes(self) -> list[str]:
        return ["critic", "value_head"]

    @override(TorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Next-token logits after each row's last real token (inference; rollouts use a backend instead)."""
        out = self.policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        last = batch["attention_mask"].sum(-1) - 1
        return {"logits": out.logits[torch.arange(len(last), device=last.device), last]}

    @override(TorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        """Per-token ``logp``, ``entropy`` and (with a critic) ``values``, each (B, T), position 0 zero.

        With ``batch["score_mask"]`` (B, T), log-probs and entropies are computed at its tokens only (the sampled
        ones: all a loss reads) and are zero elsewhere: the LM head and its softmax skip every other position."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        scored = batch.get("score_mask")
        if scored is not None:
            # Every trajectory opens with the same system prompt and instructions: read once per batch.
            out = forward_sharing_prefix(self.policy.get_decoder(), ids, mask, prefix=self._prefix)
            hidden = out["last_hidden_state"]
            logp, entropy = scored_logprobs_and_entropy(
                hidden, self.policy.get_output_embeddings(), ids, scored, self.temperature
            )
        else:
            out = forward_sharing_prefix(
                self.policy, ids, mask, output_hidden_states=self.critic_type == "head", prefix=self._prefix
            )
            hidden = out["hidden_states"][-1] if self.critic_type == "head" else None
            logp, entropy = token_logprobs_and_entropy(out["logits"], ids, self.temperature)
        result = {"logp": logp, "entropy": entropy}
        if self.critic_type == "separate":
            result["values"] = shift_right(self.critic(ids, mask)[:, :-1])
        elif self.critic_type == "head":
            result["values"] = shift_right(self.value_head(hidden[:, :-1]).squeeze(-1).float())
        return result

    @contextlib.contextmanager
    def prefix_read_once(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """For the block, ``forward_train``'s passes over rows of ``input_ids`` read the policy's pass over the
        prefix all those rows share once (an update's micro-batches: the system prompt and instructions), and its
        share of the gradients is added on leaving the block, after the passes' own backward calls
        (:func:`~rllib_ragen.rollout.models.prefix_read_once`). The critic's trunk reads it in each pass."""
        with prefix_read_once(input_ids, attention_mask) as prefix:
            self._prefix = prefix
            try:
                yield
            finally:
                self._prefix = None

    # ---- state: torch tensors, not numpy (numpy has no bfloat16) --------------------------------------------------
    @override(TorchRLModule)
    def get_state(self, components=None, *, not_components=None, inference_only: bool = False, **kwargs):
        """The module's weights. With LoRA: ``inference_only`` gives the merged policy (what env runners and the
        export load); otherwise only what trains, the adapters and the critic (what checkpoints hold)."""
        if self.lora and inference_only:
            return {f"policy.{k}": v.cpu().clone() for k, v in merged_policy_state(self.policy).items()}
        state = {
            k: v.detach().cpu().clone()
            for k, v in self.state_dict().items()
            if not (self.lora and k.startswith("policy.") and not is_adapter_key(k))
        }
        if inference_only and not self.inference_only:
            skip = tuple(f"{a}." for a in self.get_non_inference_attributes())
            state = {k: v for k, v in state.items() if not k.startswith(skip)}
        return state

    @override(TorchRLModule)
    def set_state(self, state) -> None:
        state = {k: torch.as_tensor(v) for k, v in state.items()}
        self._check_shapes(state)
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing and self.inference_only:
            raise ValueError(f"weights for this policy are missing keys {missing[:5]}...: is it the same model?")
        if self.lora and (unexpected or not any(is_adapter_key(k) for k in state)):
            # A LoRA learner loads adapters only; plain weights would otherwise be dropped without a word.
            raise ValueError(
                f"this LoRA module takes adapter weights, got {(unexpected or list(state))[:3]}...: "
                "is the state from a module without model_config['lora']?"
            )

    def _check_shapes(self, state: dict[str, torch.Tensor]) -> None:
        """Refuse weights of another size, naming the model they were loaded into: a checkpoint restored after its
        model folder was replaced would otherwise fail deep in torch ("size mismatch for critic.head.weight")."""
        own = self.state_dict()
        mismatched = [
            (k, tuple(v.shape), tuple(own[k].shape)) for k, v in state.items() if k in own and v.shape != own[k].shape
        ]
        if mismatched:
            model = {**DEFAULT_MODEL_CONFIG, **(self.model_config or {})}["model"]
            key, theirs, ours = mismatched[0]
            raise ValueError(
                f"{len(mismatched)} weight tensors do not fit the model built from model={model!r}: {key} is "
                f"{theirs} in the weights loaded and {ours} in the model. A model folder whose config.json "
                "describes another size than the one these weights (a checkpoint) were trained with was replaced "
                "or edited since: restore with the model they were trained from, or start a new run."
            )

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The LoRA adapter weights alone (what vLLM engines receive); empty without LoRA."""
        return {k: v.detach().cpu().clone() for k, v in self.state_dict().items() if is_adapter_key(k)}

    def policy_tensors(self) -> Mapping[str, torch.Tensor]:
        """The policy's tensors where they live, under the Hugging Face model's own names, no copy: the weights
        themselves (their storage), or with LoRA the merged weights, each computed on the module's device as it is
        read. What an env runner in the same process plays (``weight_sync.py``)."""
        return MergedWeights(self.policy) if self.lora else self.policy.state_dict()

    @staticmethod
    def policy_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The policy's own ``state_dict`` (Hugging Face names) out of a module state."""
        return {k[len("policy.") :]: v for k, v in state.items() if k.startswith("policy.")}

    def save_pretrained(self, path) -> None:
        """Write the policy and its tokenizer so that plain ``transformers`` loads them (call it on an inference-only
        module: with LoRA, that one holds the merged weights)."""
        if self.lora:
            raise ValueError(
                "save_pretrained on a LoRA learner module would write the adapter; export from an "
                "inference-only module loaded with get_state(inference_only=True)."
            )
        self.policy.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


MODEL_INPUTS = ("input_ids", "attention_mask")


def trimmed_inputs(data: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The model inputs of batch ``rows``, cut to their longest sequence (right padding beyond it is dropped)."""
    width = int(data["attention_mask"][rows].sum(-1).max())
    return {key: data[key][rows, :width] for key in MODEL_INPUTS}
