"""StarPO's presets: named settings (``StarPOConfig.preset(name)``, a job's ``--preset``), each a map from a config
setter (``training``, ``rl_module``, ``learners``) to its arguments; and the labels a Tune trial's config carries in
a grid over presets or named settings."""

from __future__ import annotations

from typing import Any

from ..hardware import cpu_computes_bfloat16
from .knobs import RLLIB_FIELDS, STARPO_S_DEFAULTS


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # StarPO-S (the defaults): rollout filter, critic, no KL, clip-higher.
    "starpo-s": {
        "training": {
            k: STARPO_S_DEFAULTS[k]
            for k in ("kl_coeff", "clip_ratio_high", "rollout_filter", "rollout_filter_ratio", "advantage_estimator")
        }
    },
    # Vanilla StarPO, the paper's baseline: a KL penalty, symmetric clipping, no rollout filter.
    "starpo": {
        "training": {"kl_coeff": 0.001, "clip_ratio_high": 0.2, "rollout_filter": "none", "rollout_filter_ratio": 1.0}
    },
    # RAGEN's own StarPO-S run: Qwen2.5-0.5B-Instruct, 8 x 16 trajectories, its learning rates and reply
    # length, 256 validation states, one GPU per learner.
    "ragen-gpu": {
        "training": {
            **{
                k: STARPO_S_DEFAULTS[k]
                for k in (
                    "num_groups",
                    "group_size",
                    "rollout_filter_ratio",
                    "critic_lr",
                    "max_new_tokens_per_turn",
                    "validation_size",
                    "whiten_advantages",
                )
            },
            "lr": RLLIB_FIELDS["lr"].default,
        },
        "rl_module": {"model_config": {"model": "Qwen/Qwen2.5-0.5B-Instruct"}},
        "learners": {"num_gpus_per_learner": 1},
    },
    # SmolLM2-135M-Instruct fully fine-tuned on one GPU (a main job adds its warm start and a time budget): bf16
    # autocast updates, 512 validation states (a 5-point change needs that many, or pairing), validation before and
    # after RL only. Learning rates 1e-5 / 1e-4: the CPU jobs' 1e-4 / 1e-3 are for a 1M-parameter model trained
    # from scratch; RAGEN's 1e-6 / 1e-5 are for 200 steps of a 0.5B model, too small a step for a run of minutes.
    "smollm2-gpu": {
        "training": {
            "lr": 1e-5,
            "critic_lr": 1e-4,
            "autocast_dtype": "bfloat16",
            "validation_size": 512,
            "validation_interval": 0,
        },
        "rl_module": {"model_config": {"model": "smollm2-135m"}},
        "learners": {"num_gpus_per_learner": 1},
    },
}


# SmolLM2-135M-Instruct on a CPU, in little memory: LoRA adapters (the optimizer holds the adapters alone), group-mean
# advantages without a critic (GRPO, mean only: no value head to learn in a run of tens of iterations, and one pass per
# update); sampling and the learner's passes in bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), with
# the frozen weights stored in it (the same products, no float32 copy), else in float32 (emulated bfloat16 is several
# times slower than float32: docs/benchmarks.md). The learner's memory is one row's activations: micro-batches of one
# row, no layer re-run in the backward pass (a model setting). 256 validation states before and after RL, played 64 at
# a time (a wave's KV caches). What each setting saves and costs: docs/benchmarks.md.
_BFLOAT16 = "bfloat16" if cpu_computes_bfloat16() else None
PRESETS["smollm2-cpu"] = {
    "training": {
        **{k: STARPO_S_DEFAULTS[k] for k in ("num_groups", "validation_size")},
        "lr": 1e-4,
        "advantage_estimator": "grpo",
        "grpo_normalize_std": False,
        "group_size": 4,
        "micro_batch_size": 1,
        "max_concurrent_episodes": 64,
        "validation_interval": 0,
        "rollout_dtype": _BFLOAT16,
        "autocast_dtype": _BFLOAT16,
    },
    "rl_module": {
        "model_config": {
            "model": "smollm2-135m",
            "lora": {"r": 16, "base_dtype": _BFLOAT16},
            "activation_checkpointing": False,
        }
    },
}


# Labels a Tune trial's config carries in a grid over named settings, which set nothing themselves
# (StarPOConfig.update_from_dict): its preset (of PRESETS), or its variant (a job grid's named settings).
PRESET_LABEL = "preset"
VARIANT_LABEL = "variant"


def preset_flags(name: str) -> set[str]:
    """The fields (flag names) preset ``name`` sets, model settings by their own names."""
    return {
        key
        for setter, arguments in PRESETS[name].items()
        for key in (arguments.get("model_config", {}) if setter == "rl_module" else arguments)
    }
