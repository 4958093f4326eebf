"""StarPO's configuration: the method's knobs with the reference's StarPO-S defaults, presets, and the one place
every setting is checked (``StarPOConfig.validate``). The algorithm itself is in ``starpo.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import os
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
import torch
from ray._common.deprecation import DEPRECATED_VALUE
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.annotations import override

from ..envs import (BUILT_IN_TEXT_ENVS, REMOTE_ENV_ID, _load_entry_point, ensure_registered, make_text_env,
                    register_carried, registered_text_envs, registrations_of)
from ..envs.base import checks_reasoning_claims
from ..objectives import (ADVANTAGE_ESTIMATORS, ADVANTAGE_MASKS, AGGREGATIONS, FILTER_MODES, FILTER_TYPES,
                          KL_ESTIMATORS, REFERENCE_STRATEGIES, TOP_P_MODES, AdvantageSettings, FilterSettings,
                          fixed_kept_groups)
from ..rollout.backends import SamplingParams
from ..rollout.engine import CONTEXT_WINDOWS, RolloutConfig, Start
from ..rollout.models import BUILT_IN_MODELS
from ..rollout.protocol import LOSS_MASK_REGIONS
from ..rollout.lora import PEFT_MISSING, lora_settings, peft_available
from ..rollout.vllm_backend import VLLM_LORA_RANKS, VLLM_MISSING, vllm_available
from .inference_engines import INFERENCE_BACKENDS
from .llm_rl_module import CRITIC_TYPES, DEFAULT_MODEL_CONFIG, CausalLMRLModule

# The knobs StarPOConfig adds to AlgorithmConfig by section (the flags' --help-all groups), with the reference's
# StarPO-S values (the RAGEN paper, arXiv 2504.20073, and its public training configs). A knob that a settings
# object of a lower layer also holds (RolloutConfig, AdvantageSettings, FilterSettings) takes its default from
# there, so each default is stated once.
_R, _A, _F = RolloutConfig, AdvantageSettings, FilterSettings  # a dataclass's class attribute is its field default
KNOB_SECTIONS: dict[str, dict[str, Any]] = {
    "rollout": {
        "num_groups": 8, "group_size": 16, "max_turns": _R.max_turns, "max_actions_per_turn": _R.max_actions_per_turn,
        "max_actions_per_episode": _R.max_actions_per_episode, "temperature": 1.0, "validation_temperature": 0.5,
        "max_new_tokens_per_turn": 400, "format_penalty": _R.format_penalty,
        "ineffective_action_penalty": _R.ineffective_action_penalty,
        "ungrounded_reasoning_penalty": _R.ungrounded_reasoning_penalty, "enable_thinking": _R.enable_thinking,
        "max_context_tokens": _R.max_context_tokens, "independent_transitions": _R.independent_transitions,
        "env_reset_timeout_s": _R.env_reset_timeout_s, "env_step_timeout_s": _R.env_step_timeout_s,
        "context_window": _R.context_window, "context_window_turns": _R.context_window_turns},
    "inference": {"inference_backend": "hf", "inference_batch_size": 128, "num_inference_engines": 1,
                  "vllm_engine_config": {}},
    "advantages and rollout filter": {
        "advantage_estimator": "gae", "grpo_normalize_std": _A.normalize_std, "lambda_": _A.lam,
        "turn_level_rewards": False, "whiten_advantages": _A.whiten, "gamma_turn": _A.gamma_turn,
        "gamma_token": _A.gamma_token, "gigpo_step_gamma": _A.step_gamma, "gigpo_omega": _A.omega,
        "rollout_filter": _F.mode, "rollout_filter_ratio": _F.ratio, "rollout_filter_per_env": False,
        # RAGEN's own filter strategies (rollout_filter="top_p", ...) and their settings
        "rollout_filter_value": _F.value, "rollout_filter_type": _F.filter_type,
        "rollout_filter_include_zero": _F.include_zero, "rollout_filter_top_p_mode": _F.top_p_mode,
        "rollout_filter_selection_eps": _F.selection_eps, "rollout_filter_empty_stop_steps": 5},
    "losses": {
        "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "dual_clip": 3.0, "kl_coeff": 0.0, "kl_estimator": "k3",
        "entropy_coeff": 0.001, "loss_aggregation": "token-mean", "loss_mask": "all", "value_clip": 0.5,
        "vf_loss_coeff": 1.0, "advantage_mask": "sampled", "recompute_logprobs": True},
    "optimisation": {
        "critic_lr": 1e-5, "weight_decay": 0.01, "adam_betas": (0.9, 0.999), "micro_batch_size": None,
        "autocast_dtype": None, "updates_per_rollout_batch": 1, "max_consecutive_skipped_steps": 5,
        # one-step off-policy rollouts: overlap iteration k+1's generation with iteration k's update
        "max_policy_lag": 0, "importance_weight_cap": 2.0},
    "validation and seeds": {
        "validation_interval": 10, "validation_size": 256, "validation_group_size": 1,
        "validate_before_training": True, "train_seed_start": 10_000, "validation_seed_start": 123},
    "echo-trap diagnostics and the sentinel": {  # collapse.py, sentinel.py
        "collapse_diagnostics_interval": 5, "collapse_subsample": 8, "sentinel_rules": [],
        "sentinel_max_rollbacks": 3, "sentinel_snapshot_interval": 1, "sentinel_rollback_depth": 3},
}
STARPO_S_DEFAULTS: dict[str, Any] = {k: v for section in KNOB_SECTIONS.values() for k, v in section.items()}

# Fields RLlib itself leaves at its deprecated-value marker (-1): they stay out of the state, as RLlib wants.
_RLLIB_PLACEHOLDERS = frozenset(k for k, v in AlgorithmConfig().__dict__.items()
                                if isinstance(v, int) and not isinstance(v, bool) and v == DEPRECATED_VALUE)
MODEL_DTYPES = ("float32", "bfloat16", "float16")
AUTOCAST_DTYPES = (None, "bfloat16")  # the learner's forward passes (StarPOConfig.training(autocast_dtype=...))

# The kinds validate() checks before any range (see StarPOConfig._kind_errors).
_POSITIVE_INTS = ("num_groups", "group_size", "max_turns", "max_actions_per_turn", "max_actions_per_episode",
                  "max_new_tokens_per_turn", "updates_per_rollout_batch", "num_epochs", "validation_size",
                  "validation_group_size", "inference_batch_size", "max_consecutive_skipped_steps",
                  "max_context_tokens", "num_inference_engines", "sentinel_snapshot_interval",
                  "sentinel_rollback_depth", "rollout_filter_empty_stop_steps")
_INTS = ("validation_interval", "train_seed_start", "validation_seed_start", "collapse_diagnostics_interval",
         "collapse_subsample", "sentinel_max_rollbacks", "max_policy_lag")
_FINITE_NUMBERS = ("temperature", "validation_temperature", "format_penalty", "ineffective_action_penalty",
                   "ungrounded_reasoning_penalty", "lambda_",
                   "gamma", "clip_ratio_low", "clip_ratio_high", "kl_coeff", "entropy_coeff", "vf_loss_coeff",
                   "critic_lr", "weight_decay", "rollout_filter_ratio", "gamma_turn", "gamma_token",
                   "gigpo_step_gamma", "gigpo_omega", "importance_weight_cap", "env_reset_timeout_s",
                   "env_step_timeout_s", "rollout_filter_selection_eps")
_GPU_COUNTS = ("num_gpus_per_env_runner", "num_gpus_per_learner")  # RLlib's own fields, which it does not check
_FINITE_NUMBERS_OR_NONE = ("dual_clip", "value_clip", "grad_clip", "rollout_filter_value")
_BOOLEANS = ("enable_thinking", "grpo_normalize_std", "turn_level_rewards", "whiten_advantages", "recompute_logprobs",
             "validate_before_training", "rollout_filter_per_env", "independent_transitions")


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _in_hub_cache(model_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model_id, "config.json"), str)


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


# Keys of one entry of ``train_envs`` / ``validation_envs`` (``StarPOConfig.environment``); the count key is required
# in training entries and defaults to ``validation_size`` in validation ones.
ENV_ENTRY_KEYS = {"train_envs": ("env", "env_config", "name", "groups"),
                  "validation_envs": ("env", "env_config", "name", "states")}


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """One environment of a mixture: its name (in metrics and outputs), what builds it, and how many groups per
    training step (training) or held-out states (validation) it gets."""

    name: str
    env: Any
    env_config: dict
    count: int


def env_name(env) -> str:
    """The name an environment's trajectories and metrics carry by default: its registered id, or class name."""
    return env if isinstance(env, str) else getattr(env, "__name__", repr(env))


def _env_class(env) -> type:
    """The class a registered id (or a TextEnv class) builds."""
    return env if isinstance(env, type) else _load_entry_point(gym.spec(env).entry_point)


def env_arguments(env) -> set[str] | None:
    """The constructor arguments ``env`` (a registered id or a TextEnv class) accepts; None if it takes any."""
    parameters = inspect.signature(_env_class(env).__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.name != "self"}  # built in-process (no Hugging Face directory of their own)
VLLM_ENGINE_OPTIONS = {"tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "enforce_eager",
                       "num_gpus_per_engine"}

# Named settings, each a map from a config setter (``training``, ``rl_module``, ``learners``) to its arguments.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # StarPO-S (the defaults): rollout filter, critic, no KL, clip-higher.
    "starpo-s": {"training": {k: STARPO_S_DEFAULTS[k] for k in ("kl_coeff", "clip_ratio_high", "rollout_filter",
                                                                "rollout_filter_ratio", "advantage_estimator")}},
    # Vanilla StarPO, the paper's baseline: a KL penalty, symmetric clipping, no rollout filter.
    "starpo": {"training": {"kl_coeff": 0.001, "clip_ratio_high": 0.2, "rollout_filter": "none",
                            "rollout_filter_ratio": 1.0}},
    # The reference's own StarPO-S run: Qwen2.5-0.5B-Instruct, 8 x 16 trajectories, its learning rates and reply
    # length, 256 validation states, one GPU per learner.
    "reference-gpu": {
        "training": {"num_groups": 8, "group_size": 16, "rollout_filter_ratio": 0.25, "lr": 1e-6, "critic_lr": 1e-5,
                     "max_new_tokens_per_turn": 400, "validation_size": 256, "whiten_advantages": True},
        "rl_module": {"model_config": {"model": "Qwen/Qwen2.5-0.5B-Instruct"}},
        "learners": {"num_gpus_per_learner": 1},
    },
}


PRESET_LABEL = "preset"  # a Tune trial's preset, in a grid over presets (StarPOConfig.update_from_dict)


def preset_flags(name: str) -> set[str]:
    """The fields (flag names) preset ``name`` sets, model settings by their own names."""
    return {key for setter, arguments in PRESETS[name].items()
            for key in (arguments.get("model_config", {}) if setter == "rl_module" else arguments)}


class StarPOConfig(AlgorithmConfig):
    """Configuration of :class:`StarPO`; defaults are the reference's StarPO-S on the ``tiny`` CPU model.

    Method knobs are set with ``.training(...)`` (see ``STARPO_S_DEFAULTS`` for the full list); the model with
    ``.rl_module(model_config={"model": ..., "dtype": ..., "critic": "separate" | "head", "lora": {"r": 16}})``;
    named settings with ``.preset(name)`` (``PRESETS``).
    """

    def __init__(self, algo_class=None):
        from .starpo import StarPO  # the algorithm imports this config

        super().__init__(algo_class=algo_class or StarPO)
        for key, value in STARPO_S_DEFAULTS.items():
            setattr(self, key, copy.copy(value) if isinstance(value, (dict, list)) else value)  # none shared
        # Reference optimiser settings; gamma = lambda = 1 (trajectory-level credit).
        self.lr = 1e-6
        self.gamma = 1.0
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.minibatch_size = None  # learner rows per optimizer step; None: kept batch / updates_per_rollout_batch
        self.num_epochs = 1
        self.shuffle_batch_per_epoch = True
        self.env = "rllib_ragen/Sokoban-v0"
        # Environment mixtures (see environment()): None trains and validates on env alone.
        self.train_envs: list[dict] | None = None
        self.validation_envs: list[dict] | None = None
        # The user's environment registrations, carried to Ray's workers (rllib_ragen.envs.registrations_of).
        self.text_env_registrations: dict = {}
        self._model_config = dict(DEFAULT_MODEL_CONFIG)

    @override(AlgorithmConfig)
    def environment(self, env=NotProvided, *, train_envs=NotProvided, validation_envs=NotProvided,
                    **kwargs) -> "StarPOConfig":
        """RLlib's ``environment()``, plus environment mixtures (the reference's environment tags).

        Args:
            env: the one environment to train and validate on (a registered text-env id or a TextEnv subclass),
                with ``env_config``. With ``train_envs`` it is the first training environment, and set to it.
            train_envs: train on several environments at once: a list of ``{"env": id, "groups": g,
                "env_config": {...}, "name": str}``; each training step plays ``g`` groups of each, in this
                order, and the groups add up to ``num_groups``. ``name`` (default: the id) is what the metrics
                (``<name>/success``) and outputs call it; two entries of one id need their own names.
            validation_envs: validate on these instead of the training environments: a list of ``{"env": id,
                "states": n, "env_config": {...}, "name": str}``, ``n`` held-out states each (default
                ``validation_size``, seeds from ``validation_seed_start``). None: each training environment,
                ``validation_size`` states.
        """
        if train_envs is not NotProvided:
            self.train_envs = copy.deepcopy(train_envs)
            first = train_envs[0] if isinstance(train_envs, (list, tuple)) and train_envs else None
            if isinstance(first, dict) and env is NotProvided:  # (a malformed list is reported by validate())
                env = first.get("env", self.env)
                kwargs.setdefault("env_config", dict(first.get("env_config") or {}))
        if validation_envs is not NotProvided:
            self.validation_envs = copy.deepcopy(validation_envs)
        super().environment(env, **kwargs)
        named = [self.env, *(entry.get("env") for entry in [*(self.train_envs or []), *(self.validation_envs or [])]
                             if isinstance(entry, dict))]
        self.text_env_registrations = registrations_of(named)
        return self

    @override(AlgorithmConfig)
    def training(
        self, *,
        # rollout
        num_groups=NotProvided, group_size=NotProvided, max_turns=NotProvided, max_actions_per_turn=NotProvided,
        max_actions_per_episode=NotProvided, temperature=NotProvided, validation_temperature=NotProvided,
        max_new_tokens_per_turn=NotProvided, format_penalty=NotProvided, ineffective_action_penalty=NotProvided,
        ungrounded_reasoning_penalty=NotProvided, enable_thinking=NotProvided, max_context_tokens=NotProvided,
        inference_backend=NotProvided, inference_batch_size=NotProvided, num_inference_engines=NotProvided,
        vllm_engine_config=NotProvided, independent_transitions=NotProvided, env_reset_timeout_s=NotProvided,
        env_step_timeout_s=NotProvided, context_window=NotProvided, context_window_turns=NotProvided,
        # advantages and rollout filter
        advantage_estimator=NotProvided, grpo_normalize_std=NotProvided, lambda_=NotProvided,
        turn_level_rewards=NotProvided, whiten_advantages=NotProvided, gamma_turn=NotProvided,
        gamma_token=NotProvided, gigpo_step_gamma=NotProvided, gigpo_omega=NotProvided, rollout_filter=NotProvided,
        rollout_filter_ratio=NotProvided, rollout_filter_per_env=NotProvided, rollout_filter_value=NotProvided,
        rollout_filter_type=NotProvided, rollout_filter_include_zero=NotProvided,
        rollout_filter_top_p_mode=NotProvided, rollout_filter_selection_eps=NotProvided,
        rollout_filter_empty_stop_steps=NotProvided,
        # losses
        clip_ratio_low=NotProvided, clip_ratio_high=NotProvided, dual_clip=NotProvided, kl_coeff=NotProvided,
        kl_estimator=NotProvided, entropy_coeff=NotProvided, loss_aggregation=NotProvided, loss_mask=NotProvided,
        advantage_mask=NotProvided, value_clip=NotProvided,
        vf_loss_coeff=NotProvided, recompute_logprobs=NotProvided,
        # optimisation
        critic_lr=NotProvided, weight_decay=NotProvided, adam_betas=NotProvided, micro_batch_size=NotProvided,
        autocast_dtype=NotProvided, updates_per_rollout_batch=NotProvided, max_consecutive_skipped_steps=NotProvided,
        max_policy_lag=NotProvided, importance_weight_cap=NotProvided,
        # validation and seeds
        validation_interval=NotProvided, validation_size=NotProvided, validation_group_size=NotProvided,
        validate_before_training=NotProvided, train_seed_start=NotProvided, validation_seed_start=NotProvided,
        # echo-trap diagnostics and the sentinel
        collapse_diagnostics_interval=NotProvided, collapse_subsample=NotProvided, sentinel_rules=NotProvided,
        sentinel_max_rollbacks=NotProvided, sentinel_snapshot_interval=NotProvided,
        sentinel_rollback_depth=NotProvided,
        **kwargs,
    ) -> "StarPOConfig":
        """Set StarPO's knobs and RLlib's training fields. Defaults: the reference's StarPO-S (arXiv 2504.20073).

        RLlib's own fields pass through: ``lr`` (the actor's, 1e-6), ``gamma`` (1.0), ``grad_clip`` (1.0, applied
        to actor and critic separately), ``num_epochs`` (1), ``minibatch_size`` (learner rows per optimizer step:
        trajectories, or turns with a ``context_window``; None: the kept batch split into
        ``updates_per_rollout_batch`` steps).

        Args:
            num_groups: P, initial states per training step; every group's episodes share one reset seed.
            group_size: N, episodes per initial state; a training step plays P x N trajectories.
            max_turns: replies per episode (an environment may lower it: the bandit is single-turn).
            max_actions_per_turn: actions kept from one reply (``A1 || A2 || ...``); the paper finds 5-6 best.
            max_actions_per_episode: actions executed over the whole episode.
            temperature: sampling temperature of training rollouts; the learner scores ``softmax(logits / T)``
                with the same T, so it must be > 0.
            validation_temperature: sampling temperature on the validation set (0 is greedy).
            max_new_tokens_per_turn: reply length limit; a cut reply usually fails the format.
            format_penalty: added to a turn's reward when the reply breaks the protocol (<= 0).
            ineffective_action_penalty: added to a turn's reward for each executed action that left the state as
                it was (a Sokoban move into a wall or a blocked push, a FrozenLake step off the edge), e.g. -0.1.
                0 (the reference's): such a move costs only the move. Validation returns include it too; success
                does not depend on it.
            ungrounded_reasoning_penalty: added to a turn's reward for each action whose effect the turn's
                ``<think>`` does not state truly, wrongly or not at all, e.g. -0.05: a reward for reasoning that reads
                the state right (VAGEN's idea of rewarding grounded state descriptions, checked here by the
                environment, ``TextEnv.reasoning_claims``: Sokoban's and FrozenLake's "Up wall, Down walk, ...").
                Never positive, so a longer episode never earns more. Like every penalty it is part of the turn's
                reward, which the next turn's message shows ("Reward: -0.1"). Needs ``enable_thinking`` and
                training environments that check claims; other validation environments are not charged. 0: off.
            enable_thinking: require ``<think>...</think>`` before ``<answer>``.
            max_context_tokens: no trajectory grows longer: each reply may take only the room left, an episode with
                no room for another turn ends (truncated), one whose first prompt leaves no room is not played
                (``rollout/prompts_too_long``).
            independent_transitions: a group's episodes share their initial state but not their luck: each draws
                its payoffs or slips from its own seeded generator (``RolloutConfig.independent_transitions``).
                False (the reference's): they repeat each other's draws, so a group of N bandit pulls compares
                one coin flip with the safe arm, and a group's advantage carries one draw's noise.
            env_reset_timeout_s, env_step_timeout_s: seconds one environment ``reset()`` or ``step()`` may take.
                A later one is an isolated environment failure: its episode is dropped, counted as
                ``rollout/env_timeouts``, and the environment replaced, so a hung environment (a dead game server,
                an infinite loop) never hangs ``train()``.
            context_window: what the policy reads before each reply. ``"full"`` (the reference's default): the whole
                conversation, one append-only token sequence per episode, trained as one row. ``"last_k_turns"``:
                the system prompt and the instructions, then the last ``context_window_turns`` turns (the current
                one included), re-rendered each turn; ``"single_turn"``: the instructions and the current state
                only (RAGEN's ``context_window_mode`` limited_multi_turn / single_turn). With a window each turn is
                its own training row (its prompt and its sampled reply, exact to the token), and the context no
                longer grows with the episode; advantages stay the episode's, each turn's placed on its own row.
            context_window_turns: k of ``"last_k_turns"``, at least 2 (k = 1 is ``"single_turn"``); RAGEN's
                ``max_context_window``. None with the other windows.
            inference_backend: a name in ``INFERENCE_BACKENDS`` (``starpo/inference_engines.py``): ``"hf"``
                (batched KV-cached sampling in the env runner), ``"vllm"`` (vLLM engines as Ray actors, shared by
                all env runners, new weights loaded after every update; needs vLLM), one you registered with
                ``register_inference_backend``; or a callable ``(model, tokenizer, config) -> InferenceBackend``.
            inference_batch_size: prompts per generation batch of the HF backend.
            num_inference_engines: vLLM engines (Ray actors, ``tensor_parallel_size`` GPUs each).
            vllm_engine_config: keyword arguments of :class:`~rllib_ragen.rollout.vllm_backend.VLLMEngine`:
                ``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``, ``enforce_eager``; plus
                ``num_gpus_per_engine`` to override the GPUs each engine's bundle asks for.
            advantage_estimator: a name in ``rllib_ragen.objectives.ADVANTAGE_ESTIMATORS``: ``"gae"`` (PPO with a
                critic: StarPO-S), ``"bi_level_gae"`` (TRICO: GAE across turns with ``gamma_turn``, then inside
                each turn with ``gamma_token``), ``"turn_gae"`` (one GAE advantage per turn, from the turn-end
                values), ``"gigpo"`` (GRPO plus ``gigpo_omega`` x a step advantage among the group's turns that saw
                the same state), ``"grpo"`` (return normalised within its group), ``"brpo"`` (normalised over the
                batch), ``"raw"`` (the return itself), or one you registered with
                ``register_advantage_estimator``. Estimators that need a critic run on the learner, the others on
                the driver. The turn-aware ones want ``turn_level_rewards=True``.
            grpo_normalize_std: divide by the group's (batch's) std for grpo/brpo. Off gives mean-only
                advantages, which avoid amplifying tiny differences in nearly-uniform groups.
            lambda_: GAE lambda of every GAE-family estimator (1.0: with gamma 1 the advantage is return minus
                value).
            whiten_advantages: whiten the advantages of estimators with a critic (gae, bi_level_gae, turn_gae)
                over the batch's generated tokens (masked mean, Bessel std), as the reference does. With several
                learners too: their statistics are summed over the shards (an all-reduce).
            gamma_turn, gamma_token: ``bi_level_gae``'s discounts across turns and inside a turn (the
                reference's: 0.95 and 1.0); ``turn_gae`` discounts with ``gamma_turn``. ``gae`` uses ``gamma``.
            gigpo_step_gamma: discount of GiGPO's step returns.
            gigpo_omega: weight of GiGPO's step-level advantage (0: GRPO).
            turn_level_rewards: put each turn's reward on that turn's last token instead of the whole return on
                the trajectory's last token (turn-level credit; matters with gamma < 1 or a critic).
            rollout_filter: ``"std"`` keeps the groups whose returns vary most (StarPO-S), ``"reversed_std"``
                the least, ``"none"`` all. RAGEN's strategies over the group's reward std (sample std):
                ``"top_p"`` (the best groups whose scores add up to ``rollout_filter_value`` of the total, or a
                softmax nucleus), ``"top_k"`` (``int(value x num_groups)`` groups), ``"top_k_abs"`` (``int(value)``
                groups), ``"min_p"`` (scores at least ``value`` x the best); and ``"snr_adaptive"``, RAGEN-2's
                SNR-Adaptive Filtering: linear top-p over the non-zero-variance groups, a top-p of 0.9 unless
                ``rollout_filter_value`` says otherwise. Definitions: ``rllib_ragen/objectives/rollout_filter.py``.
                ``top_p``, ``min_p`` and ``snr_adaptive`` keep a number of groups that varies, possibly none: that
                iteration then skips its update (``rollout_filter/empty_steps``).
            rollout_filter_ratio: share of groups ``std`` and ``reversed_std`` keep (0.25: top quarter); 1.0 keeps
                everything.
            rollout_filter_value: the threshold of RAGEN's strategies (their ``rollout_filter_value``): p of
                ``top_p`` and ``snr_adaptive`` (None: 0.9), the share of ``top_k``, the count of ``top_k_abs``,
                the fraction of the best score of ``min_p``. None with ``std``, ``reversed_std`` and ``none``.
            rollout_filter_type: ``"largest"`` keeps the high-variance groups, ``"smallest"`` the low ones
                (RAGEN's strategies only; ``reversed_std`` is ``std``'s).
            rollout_filter_include_zero: whether groups whose episodes all returned the same stay candidates.
                None: the strategy's own (True; ``snr_adaptive`` drops them, which is its definition).
            rollout_filter_top_p_mode: ``"linear"`` (the running sum of scores, RAGEN's recommended) or
                ``"softmax"`` (probability mass of softmax(scores)) for ``top_p``.
            rollout_filter_selection_eps: linear top-p's threshold is ``value x sum(scores) - eps`` (0.01).
            rollout_filter_empty_stop_steps: this many iterations in a row whose filter kept no group end the run
                (``result["done"]``, as RAGEN stops early): the policy has no reward variance left to learn from.
            rollout_filter_per_env: with ``train_envs``, rank and keep groups within each training environment
                (``ceil(ratio x its groups)`` each) instead of across the whole batch (False, the reference's), where
                one environment's groups can all be dropped from an update. The same with one environment.
            clip_ratio_low, clip_ratio_high: PPO clip range [1 - low, 1 + high]; 0.2 / 0.28 is "clip-higher",
                which leaves room for rare tokens to gain probability.
            dual_clip: bound c on the loss of negative-advantage tokens (> 1), or None to switch it off.
            kl_coeff: weight of KL(policy || frozen initial policy); 0 (StarPO-S) does not load the reference.
            kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (low-variance, >= 0).
            entropy_coeff: entropy bonus weight.
            loss_aggregation: ``"token-mean"`` (every token weighs the same), ``"seq-mean-token-mean"`` (every
                trajectory weighs the same) or ``"seq-mean-token-sum"``.
            loss_mask: which sampled tokens the policy loss (and its entropy and KL terms) trains: ``"all"`` (the
                reference's), ``"no_think"`` (all but the reasoning inside ``<think>...</think>``) or
                ``"answer"`` (the ``<answer>...</answer>`` block alone). Template and observation tokens are never
                trained. With ``"answer"`` the format penalty cannot train a malformed tag outside the answer block,
                so format errors can grow. The advantage recursion and the value loss run over the
                ``advantage_mask``'s tokens, which hold every sampled token: rewards sit on each turn's last one.
            advantage_mask: which tokens ``gae``'s recursion steps through and the critic is trained on (VAGEN's
                "GAE mask"): ``"sampled"`` (the policy's own tokens, skipping the environment's: the reference's)
                or ``"sampled_and_observations"`` (the observation tokens between turns are steps too, with no
                reward, so with gamma * lambda_ < 1 credit fades across them: the reference's ablation without
                the mask). Only sampled tokens are ever trained. The turn-level estimators recurse over turns and
                the critic-free ones do not recurse, so it applies to ``gae`` alone.
            value_clip: clip range of the value loss around the old values, or None.
            vf_loss_coeff: weight of the value loss.
            recompute_logprobs: use the learner's own pass for the old log-probs (the first ratio is then exactly
                1 whatever the backend); False uses the rollout's. Their gap is logged either way.
            critic_lr: the critic's learning rate (the actor's is ``lr``).
            weight_decay, adam_betas: AdamW settings of both optimizers.
            micro_batch_size: learner rows per forward/backward pass; gradients accumulate to the minibatch's,
                so memory drops without changing the update. None: the whole minibatch at once.
            autocast_dtype: ``"bfloat16"`` runs the learner's forward passes (its scores, the losses, the echo-trap
                probe) under ``torch.autocast`` in bfloat16, while weights, gradients and AdamW's moments stay in
                the model's dtype (float32): the GPU's fast update. The first step's ratio stays 1 (score and loss
                share the precision); the gap to the rollout's float32 log-probs grows (``rollout/logprob_gap_*``).
                For GPUs: a CPU without bfloat16 matrix units computes it several times slower than float32.
                None (default): every pass in the model's dtype.
            updates_per_rollout_batch: optimizer steps per rollout batch and epoch (the reference's implicit
                "Online-k"); 1 (fresh rollouts every update) is what the paper recommends.
            max_consecutive_skipped_steps: an optimizer step whose loss or gradient is not finite is skipped,
                weights and optimizer state untouched, and counted (``perf/skipped_optimizer_steps``); this many
                in a row stop training with an error.
            max_policy_lag: 1 plays iteration k+1's rollout on the remote env runners while the learner runs
                iteration k's update (one-step off-policy: that rollout comes from the policy one update old);
                0 alternates them. Needs ``num_env_runners >= 1`` and ``recompute_logprobs``. The
                lag of every trained batch is logged (``rollout/policy_lag``) and never exceeds this.
            importance_weight_cap: with ``max_policy_lag=1``, each token's advantage is weighted by
                ``min(pi_old / pi_behaviour, cap)``, where pi_old is the learner's policy before the update (the
                PPO ratio's denominator) and pi_behaviour the one that sampled the token (decoupled PPO with a
                truncated importance weight).
            validation_interval: play the validation set every k iterations (0: never).
            validation_size: fixed validation initial states (seeds from ``validation_seed_start`` on).
            validation_group_size: episodes per validation state.
            validate_before_training: also validate before the first update (even with validation_interval=0), for a
                before/after comparison.
            train_seed_start, validation_seed_start: first training and validation reset seeds. Training seeds
                advance by ``num_groups`` each step and never repeat.
            collapse_diagnostics_interval: run the learner's echo-trap probe (cross-scoring: retrieval accuracy and
                MI estimate; the policy-gradient norm per reward-variance bucket) every k iterations, on the
                current rollout before its update (0: never). The cheap reply diagnostics run every iteration.
            collapse_subsample: first-turn reasonings cross-scored by the probe (m; m x m scoring passes).
            sentinel_rules: :class:`~rllib_ragen.sentinel.Rule` objects watched after every iteration; see ``rllib_ragen/sentinel.py``.
            sentinel_max_rollbacks: rollbacks allowed per run; a rollback rule firing after that stops the run.
            sentinel_snapshot_interval: with a rollback rule, keep the weights and optimizer state of every k-th
                healthy iteration (on local disk) as rollback points.
            sentinel_rollback_depth: a rollback restores the oldest of the last this many snapshots. The
                signals can trail a sudden collapse by a few iterations (docs: Echo trap), so the
                newest "healthy" snapshot may already hold collapsed weights.
        """
        given = {k: v for k, v in locals().items() if k in STARPO_S_DEFAULTS and v is not NotProvided}
        super().training(**kwargs)
        for key, value in given.items():
            setattr(self, key, value)
        return self

    @override(AlgorithmConfig)
    def rl_module(self, *, model_config=NotProvided, **kwargs) -> "StarPOConfig":
        """``model_config`` is merged over the defaults, so ``{"model": "smollm2-135m"}`` keeps the rest."""
        if model_config is not NotProvided:
            model_config = {**DEFAULT_MODEL_CONFIG, **model_config}
        return super().rl_module(model_config=model_config, **kwargs)

    @override(AlgorithmConfig)
    def get_state(self) -> dict[str, Any]:
        """RLlib's state, with every value the user set kept, -1 included.

        RLlib drops each field equal to its "deprecated value" marker, -1, from the state it copies a config into
        the algorithm and checkpoints with; a knob set to -1 (``format_penalty=-1.0``) would silently become its
        default. Only RLlib's own deprecated placeholders (-1 in a fresh ``AlgorithmConfig``) stay dropped.
        """
        state = super().get_state()
        for key, value in self.__dict__.items():
            if key not in state and key not in _RLLIB_PLACEHOLDERS and key not in ("algo_class", "_is_frozen"):
                state[key] = value
        return state

    def preset(self, name: str) -> "StarPOConfig":
        """Apply the named settings of ``PRESETS``: ``"starpo-s"`` (the defaults), ``"starpo"`` (vanilla: KL 0.001,
        clip 0.2/0.2, no filter) or ``"reference-gpu"`` (the reference's model and scale, on GPUs)."""
        if name not in PRESETS:
            raise ValueError(f"preset {name!r}: choose one of {sorted(PRESETS)}.")
        for setter, arguments in PRESETS[name].items():
            getattr(self, setter)(**arguments)
        return self

    @override(AlgorithmConfig)
    def update_from_dict(self, config_dict: dict) -> "StarPOConfig":
        """RLlib's, except that a ``"preset"`` key is a label and sets nothing: a Tune grid over presets
        (``--grid '{"preset": [...]}'``) names each trial's preset with it, and resolves the preset's own fields
        beside it (``experiment.preset_grid``). Set as an attribute, it would hide the :meth:`preset` method."""
        return super().update_from_dict({k: v for k, v in config_dict.items() if k != PRESET_LABEL})

    # ---- what RLlib builds -----------------------------------------------------------------------------------------
    @override(AlgorithmConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=CausalLMRLModule)

    @override(AlgorithmConfig)
    def get_default_learner_class(self):
        from .starpo_learner import StarPOTorchLearner

        return StarPOTorchLearner

    @property
    def env_runner_cls(self):
        from .text_env_runner import TextEnvRunner

        return TextEnvRunner if self._env_runner_cls is None else self._env_runner_cls

    @env_runner_cls.setter
    def env_runner_cls(self, value):
        self._env_runner_cls = value

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        estimator = ADVANTAGE_ESTIMATORS.get(self.advantage_estimator)
        return {"value_function": bool(estimator and estimator.needs_critic), "temperature": self.temperature}

    @property
    def model_config(self):
        # Our auto-includes follow the training settings, so they win over a stale user copy of them.
        return {**DEFAULT_MODEL_CONFIG, **super().model_config, **self._model_config_auto_includes}

    # ---- derived settings ------------------------------------------------------------------------------------------
    def policy_tokenizer(self):
        """The tokenizer of the policy model (``model_config["model"]``), as the algorithm loads it."""
        from ..rollout.models import load_policy

        return load_policy(self.model_config["model"], seed=self.seed or 0)[1]

    def training_environments(self) -> list[EnvEntry]:
        """What each training step plays: ``env`` alone (``num_groups`` groups), or the ``train_envs`` mixture."""
        if self.train_envs is None:
            return [EnvEntry(env_name(self.env), self.env, dict(self.env_config), self.num_groups)]
        return [_entry(item, "groups", None) for item in self.train_envs]

    def validation_environments(self) -> list[EnvEntry]:
        """What validation plays: ``validation_envs``, else every training environment, ``validation_size``
        states each."""
        if self.validation_envs is None:
            return [dataclasses.replace(e, count=self.validation_size) for e in self.training_environments()]
        return [_entry(item, "states", self.validation_size) for item in self.validation_envs]

    @property
    def env_name(self) -> str:
        """The name of the (first) training environment in metrics: ``<env_name>/success``."""
        return self.training_environments()[0].name

    @property
    def is_mixture(self) -> bool:
        """Whether rollouts name their environment in each start (``(name, seed)``) rather than playing ``env``."""
        return self.train_envs is not None or self.validation_envs is not None

    def training_starts(self, seeds: Sequence[int]) -> list[Start]:
        """A training step's group starts from its ``num_groups`` fresh seeds: the seeds themselves for one
        environment; for a mixture, ``(name, seed)``, each environment taking its groups in ``train_envs`` order."""
        if not self.is_mixture:
            return [int(s) for s in seeds]
        names = [e.name for e in self.training_environments() for _ in range(e.count)]
        return [(name, int(seed)) for name, seed in zip(names, seeds, strict=True)]

    def validation_starts(self) -> list[Start]:
        """The fixed held-out starts: ``states`` seeds from ``validation_seed_start`` per validation environment."""
        entries = self.validation_environments()
        seeds = {e.name: range(self.validation_seed_start, self.validation_seed_start + e.count) for e in entries}
        if not self.is_mixture:
            return [int(s) for s in seeds[entries[0].name]]
        return [(e.name, int(seed)) for e in entries for seed in seeds[e.name]]

    def rollout_config(self) -> RolloutConfig:
        named = {e.name: (e.env, e.env_config) for e in self.training_environments() + self.validation_environments()}
        environments = tuple((name, env, env_config) for name, (env, env_config) in named.items()) \
            if self.is_mixture else ()
        return RolloutConfig(env=self.env, env_config=dict(self.env_config), environments=environments,
                             max_turns=self.max_turns,
                             max_actions_per_turn=self.max_actions_per_turn,
                             max_actions_per_episode=self.max_actions_per_episode, format_penalty=self.format_penalty,
                             ineffective_action_penalty=self.ineffective_action_penalty,
                             ungrounded_reasoning_penalty=self.ungrounded_reasoning_penalty,
                             enable_thinking=self.enable_thinking, max_context_tokens=self.max_context_tokens,
                             independent_transitions=self.independent_transitions,
                             context_window=self.context_window, context_window_turns=self.context_window_turns,
                             env_reset_timeout_s=self.env_reset_timeout_s,
                             env_step_timeout_s=self.env_step_timeout_s)

    def sampling_params(self, validation: bool = False) -> SamplingParams:
        return SamplingParams(temperature=self.validation_temperature if validation else self.temperature,
                              max_new_tokens=self.max_new_tokens_per_turn)

    def advantage_settings(self) -> AdvantageSettings:
        return AdvantageSettings(gamma=self.gamma, lam=self.lambda_, normalize_std=self.grpo_normalize_std,
                                 gamma_turn=self.gamma_turn, gamma_token=self.gamma_token,
                                 step_gamma=self.gigpo_step_gamma, omega=self.gigpo_omega,
                                 whiten=self.whiten_advantages)

    def filter_settings(self, keep_ratio: float | None = None) -> FilterSettings:
        """The rollout filter, ``keep_ratio`` replacing ``rollout_filter_ratio`` (a sentinel rollback's)."""
        return FilterSettings(mode=self.rollout_filter,
                              ratio=self.rollout_filter_ratio if keep_ratio is None else keep_ratio,
                              value=self.rollout_filter_value, filter_type=self.rollout_filter_type,
                              include_zero=self.rollout_filter_include_zero, top_p_mode=self.rollout_filter_top_p_mode,
                              selection_eps=self.rollout_filter_selection_eps)

    @property
    def num_kept_groups(self) -> int | None:
        """Groups left for the update after the rollout filter (per environment: the sum of each one's share);
        None when the filter keeps a number that depends on the rollout (``fixed_kept_groups``)."""
        settings = self.filter_settings()
        counts = ([e.count for e in self.training_environments()] if self.rollout_filter_per_env and self.is_mixture
                  else [self.num_groups])
        kept = [fixed_kept_groups(count, settings) for count in counts]
        return None if None in kept else sum(kept)

    @property
    def kept_batch_size(self) -> int | None:
        """Trajectories left for the update after the rollout filter (None: it depends on the rollout)."""
        return None if self.num_kept_groups is None else self.num_kept_groups * self.group_size

    def optimizer_steps(self, rows: int) -> int:
        """Optimizer steps per epoch on a batch of ``rows`` learner rows (trajectories, or turn samples with a
        context window): ``rows // minibatch_size`` (at least 1), else ``updates_per_rollout_batch``."""
        if self.minibatch_size is not None:
            return max(1, rows // self.minibatch_size)
        return self.updates_per_rollout_batch

    @property
    def effective_updates_per_rollout_batch(self) -> int:
        """Optimizer steps per epoch on the kept batch (on the largest it can be, when its size varies)."""
        return self.optimizer_steps(self.kept_batch_size or self.num_groups * self.group_size)

    # ---- validation: the one place settings are checked ----------------------------------------------------------
    @override(AlgorithmConfig)
    def validate(self) -> None:
        register_carried(self.text_env_registrations)  # in a Tune trial's process, which never registered them
        super().validate()
        errors = list(self._starpo_errors())
        if errors:
            raise ValueError("Invalid StarPOConfig:\n  - " + "\n  - ".join(errors))

    def _starpo_errors(self):
        kind_errors = list(self._kind_errors())
        if kind_errors:  # the range checks below compare numbers: a string or a NaN would crash them
            yield from kind_errors
            return

        def choice(field, options):
            if getattr(self, field) not in options:
                return f"{field}={getattr(self, field)!r}: choose one of {sorted(options)}."
            return None

        checks = [
            choice("advantage_estimator", ADVANTAGE_ESTIMATORS), choice("rollout_filter", FILTER_MODES),
            choice("loss_aggregation", AGGREGATIONS), choice("kl_estimator", KL_ESTIMATORS),
            choice("loss_mask", LOSS_MASK_REGIONS), choice("advantage_mask", ADVANTAGE_MASKS),
            choice("rollout_filter_type", FILTER_TYPES), choice("rollout_filter_top_p_mode", TOP_P_MODES),
            choice("context_window", CONTEXT_WINDOWS),
        ]
        yield from (c for c in checks if c)
        for field in _POSITIVE_INTS:
            if getattr(self, field) < 1:
                yield f"{field}={getattr(self, field)!r} must be a positive integer."
        for field in ("train_seed_start", "validation_seed_start"):
            if getattr(self, field) < 0:
                yield f"{field}={getattr(self, field)!r} must be >= 0 (a reset seed)."
        for field in _GPU_COUNTS:
            if getattr(self, field) < 0:
                yield f"{field}={getattr(self, field)!r} must be >= 0 (0: the CPU; a fraction shares a GPU)."
        if self.autocast_dtype not in AUTOCAST_DTYPES:
            yield (f"autocast_dtype={self.autocast_dtype!r}: choose one of {list(AUTOCAST_DTYPES)} (float16 would "
                   "need a loss scaler; bfloat16 does not).")
        elif self.autocast_dtype is not None and \
                str(self.model_config.get("dtype", "float32")).removeprefix("torch.") != "float32":
            yield (f"autocast_dtype={self.autocast_dtype!r} with model_config['dtype']="
                   f"{self.model_config.get('dtype')!r}: autocast keeps float32 weights and computes in bfloat16; "
                   "with weights in a low precision already, set autocast_dtype=None (or dtype='float32').")
        # A learning rate <= 0 would train by gradient ascent, or not at all.
        if _is_number(self.lr) and self.lr <= 0:
            yield f"lr={self.lr} must be > 0."
        if self.critic_lr <= 0:
            yield f"critic_lr={self.critic_lr} must be > 0."
        for field in ("grad_clip", "value_clip"):
            if getattr(self, field) is not None and getattr(self, field) <= 0:
                yield f"{field}={getattr(self, field)} must be > 0, or None to switch it off."
        if not 0.0 <= self.lambda_ <= 1.0:
            yield f"lambda_={self.lambda_} must lie in [0, 1]."
        for field in ("gamma", "gamma_turn", "gamma_token", "gigpo_step_gamma"):
            if not 0.0 < getattr(self, field) <= 1.0:
                yield f"{field}={getattr(self, field)} must lie in (0, 1]."
        if self.advantage_mask != "sampled" and self.advantage_estimator != "gae":
            yield (f"advantage_mask={self.advantage_mask!r} applies to advantage_estimator='gae' only (the turn-level "
                   f"estimators recurse over turns, the critic-free ones not at all); with "
                   f"advantage_estimator={self.advantage_estimator!r} set advantage_mask='sampled'.")
        yield from self._reasoning_penalty_errors()
        if self.gigpo_omega < 0:
            yield f"gigpo_omega={self.gigpo_omega} must be >= 0 (0 is GRPO)."
        if self.minibatch_size is not None and self.minibatch_size < 1:
            yield f"minibatch_size={self.minibatch_size} must be >= 1 trajectory, or None (the kept batch split evenly)."
        # A penalty pays nothing for breaking the protocol or wasting a move: > 0 would reward it.
        for field in ("format_penalty", "ineffective_action_penalty"):
            if getattr(self, field) > 0:
                yield f"{field}={getattr(self, field)} must be <= 0: a positive value would reward what it penalises."
        for field in ("env_reset_timeout_s", "env_step_timeout_s"):
            if getattr(self, field) <= 0:
                yield f"{field}={getattr(self, field)} must be > 0 seconds (the longest one environment call may take)."
        if self.vf_loss_coeff < 0 or self.weight_decay < 0:
            yield f"vf_loss_coeff={self.vf_loss_coeff} and weight_decay={self.weight_decay} must be >= 0."
        if not _is_known_env(self.env):
            yield (f"env={self.env!r} is not a registered text environment; pick one of {registered_text_envs()} "
                   "or register yours with rllib_ragen.register_text_env.")
        # The filter keeps ceil(ratio * groups) groups: 0 would keep nothing, > 1 more groups than exist.
        if not 0.0 < self.rollout_filter_ratio <= 1.0:
            yield f"rollout_filter_ratio={self.rollout_filter_ratio} must lie in (0, 1]."
        yield from self._filter_strategy_errors()
        yield from self._context_window_errors()
        # The learner scores softmax(logits / T): T = 0 (greedy) has no log-probs to train on.
        if self.temperature <= 0:
            yield f"temperature={self.temperature} must be > 0 for training rollouts (their log-probs are trained on)."
        if self.validation_temperature < 0:
            yield f"validation_temperature={self.validation_temperature} must be >= 0 (0 is greedy)."
        if self.clip_ratio_low < 0 or self.clip_ratio_high < 0 or self.clip_ratio_low >= 1:
            yield f"clip_ratio_low={self.clip_ratio_low}, clip_ratio_high={self.clip_ratio_high} must be >= 0, low < 1."
        # Dual clipping bounds a negative-advantage token's loss by c * |A|: c <= 1 would undercut the PPO clip.
        if self.dual_clip is not None and self.dual_clip <= 1:
            yield f"dual_clip={self.dual_clip} must be > 1, or None to switch it off."
        if self.kl_coeff < 0 or self.entropy_coeff < 0:
            yield f"kl_coeff={self.kl_coeff} and entropy_coeff={self.entropy_coeff} must be >= 0."
        # A group of one has nothing to be compared with: every advantage would be 0.
        if self.advantage_estimator in ("grpo", "gigpo") and self.group_size < 2:
            yield (f"advantage_estimator={self.advantage_estimator!r} compares trajectories within a group: set "
                   "group_size >= 2.")
        if self.validation_interval is None or self.validation_interval < 0:
            yield f"validation_interval={self.validation_interval} must be >= 0 (0 switches validation off)."
        yield from self._batch_shape_errors()
        yield from self._off_policy_errors()
        yield from self._sentinel_errors()
        yield from self._inference_errors()
        yield from self._model_and_env_errors()

    def _filter_strategy_errors(self):
        """RAGEN's strategies' settings: each given where it means something, and in its range."""
        mode, value = self.rollout_filter, self.rollout_filter_value
        if mode not in REFERENCE_STRATEGIES:
            given = [f"{field}={getattr(self, field)!r}" for field, default in (
                ("rollout_filter_value", None), ("rollout_filter_type", "largest"),
                ("rollout_filter_include_zero", None), ("rollout_filter_top_p_mode", "linear"))
                if getattr(self, field) != default]
            if given:
                yield (f"{', '.join(given)} set RAGEN's filter strategies, and rollout_filter={mode!r} is not one: "
                       f"choose rollout_filter in {list(REFERENCE_STRATEGIES)}, or leave them at their defaults "
                       "(std's share is rollout_filter_ratio).")
            return
        if self.rollout_filter_include_zero is not None and not isinstance(self.rollout_filter_include_zero,
                                                                           (bool, np.bool_)):
            yield f"rollout_filter_include_zero={self.rollout_filter_include_zero!r} must be True, False or None."
        if value is None and mode != "snr_adaptive":
            yield f"rollout_filter={mode!r} needs rollout_filter_value (its threshold; RAGEN's top_p: 0.9)."
        elif value is not None and mode in ("top_p", "snr_adaptive", "top_k", "min_p") and not 0.0 < value <= 1.0:
            yield f"rollout_filter_value={value} must lie in (0, 1] for rollout_filter={mode!r}."
        elif mode == "top_k_abs" and value is not None and (value < 1 or value != int(value)):
            yield f"rollout_filter_value={value} must be a whole number of groups >= 1 for rollout_filter='top_k_abs'."
        elif mode == "top_k_abs" and value is not None and value > self.num_groups:
            yield (f"rollout_filter_value={value:g} keeps more groups than a rollout has (num_groups="
                   f"{self.num_groups}), so rollout_filter='top_k_abs' would keep them all: lower it to at most "
                   "num_groups, or set rollout_filter='none' to keep every group.")
        if mode == "snr_adaptive":
            if self.rollout_filter_include_zero:
                yield ("rollout_filter='snr_adaptive' drops zero-variance groups by definition: leave "
                       "rollout_filter_include_zero at None, or use rollout_filter='top_p' to keep them.")
            if self.rollout_filter_type != "largest" or self.rollout_filter_top_p_mode != "linear":
                yield ("rollout_filter='snr_adaptive' is linear top-p over the largest variances (RAGEN-2): use "
                       "rollout_filter='top_p' for rollout_filter_type='smallest' or the softmax mode.")
        if mode != "top_p" and self.rollout_filter_top_p_mode != "linear":
            yield f"rollout_filter_top_p_mode={self.rollout_filter_top_p_mode!r} applies to rollout_filter='top_p' only."
        if self.rollout_filter_selection_eps < 0:
            yield f"rollout_filter_selection_eps={self.rollout_filter_selection_eps} must be >= 0."
        # The reference's score is the sample std: a group of one has none.
        if self.group_size < 2:
            yield f"rollout_filter={mode!r} scores each group by its reward std: set group_size >= 2."
        if self.num_kept_groups is None and self.num_learners > 1:
            yield (f"rollout_filter={mode!r} keeps a number of groups that varies from rollout to rollout, and "
                   f"num_learners={self.num_learners} learners each need a share of whole groups: use one learner, "
                   "or a filter that keeps a fixed number (std, top_k or top_k_abs with zero-variance groups "
                   "included).")

    def _context_window_errors(self):
        window, turns = self.context_window, self.context_window_turns
        if window == "last_k_turns":
            if not _is_int(turns) or turns < 2:
                yield (f"context_window='last_k_turns' needs context_window_turns >= 2 (the turns in view, the "
                       f"current one included), got {turns!r}; for one turn use context_window='single_turn'.")
        elif turns is not None:
            yield (f"context_window_turns={turns!r} applies to context_window='last_k_turns' only "
                   f"(context_window={window!r}).")
        if window != "full" and self.advantage_mask != "sampled":
            yield (f"advantage_mask={self.advantage_mask!r} steps through the observation tokens between replies, "
                   f"which a context_window={window!r} episode has in no single row: use advantage_mask='sampled'.")

    def _reasoning_penalty_errors(self):
        penalty = self.ungrounded_reasoning_penalty
        if penalty > 0:
            yield (f"ungrounded_reasoning_penalty={penalty} must be <= 0: it is charged per action not stated truly, "
                   "and a positive value would pay for wrong reasoning.")
        if penalty == 0:
            return
        if not self.enable_thinking:
            yield (f"ungrounded_reasoning_penalty={penalty} charges what the <think> block says, and "
                   "enable_thinking=False: set enable_thinking=True, or the penalty to 0.")
        silent = [e.name for e in self.training_environments() if _is_known_env(e.env)
                  and not checks_reasoning_claims(_env_class(e.env))]
        if silent:
            yield (f"ungrounded_reasoning_penalty={penalty}, but training environment(s) {silent} check no claims "
                   "about their state (TextEnv.reasoning_claims), so every turn would be charged in full: train on "
                   "ones that do (Sokoban, FrozenLake) or set the penalty to 0.")

    def _off_policy_errors(self):
        if self.max_policy_lag not in (0, 1):
            yield (f"max_policy_lag={self.max_policy_lag}: choose 0 (synchronous) or 1 (one-step off-policy; "
                   "longer lags are not implemented).")
        elif self.max_policy_lag == 1:
            if self.num_env_runners < 1 and not self.in_evaluation:  # (RLlib's evaluation copy has none)
                yield ("max_policy_lag=1 overlaps the rollout on remote env runners with the local update: set "
                       "num_env_runners >= 1 in .env_runners().")
            if not self.recompute_logprobs:
                yield ("max_policy_lag=1 needs recompute_logprobs=True: the PPO ratio is taken against the learner's "
                       "pre-update policy, and the behaviour policy's log-probs only weight it.")
        if self.importance_weight_cap < 1:
            yield f"importance_weight_cap={self.importance_weight_cap} must be >= 1 (1 drops the correction's upside)."

    def _kind_errors(self):
        """Each knob of the right kind: numbers finite, booleans booleans, integers integers."""
        for field in _FINITE_NUMBERS + _FINITE_NUMBERS_OR_NONE + _GPU_COUNTS:
            value = getattr(self, field)
            if value is None and field in _FINITE_NUMBERS_OR_NONE:
                continue
            if not _is_number(value) or not math.isfinite(value):
                yield f"{field}={value!r} must be a finite number{' or None' * (field in _FINITE_NUMBERS_OR_NONE)}."
        # (RLlib also accepts a schedule for lr: a list of [timestep, value] pairs)
        if isinstance(self.lr, (list, tuple)):
            yield from _lr_schedule_errors(self.lr)
        elif not (_is_number(self.lr) and math.isfinite(self.lr)):
            yield f"lr={self.lr!r} must be a finite number."
        # RLlib's own counts, which it takes as given: True would count as 1 and False as 0.
        for field in ("num_env_runners", "num_learners"):
            if not _is_int(getattr(self, field)):
                yield f"{field}={getattr(self, field)!r} must be an integer >= 0."
        if _is_int(self.seed) and not 0 <= self.seed < 2**32:
            yield f"seed={self.seed} must lie in [0, 2**32) (numpy's seeds), or be None."
        for field in ("minibatch_size", "seed", "context_window_turns"):
            if getattr(self, field) is not None and not _is_int(getattr(self, field)):
                yield f"{field}={getattr(self, field)!r} must be an integer or None."
        for field in _BOOLEANS:
            if not isinstance(getattr(self, field), (bool, np.bool_)):
                yield f"{field}={getattr(self, field)!r} must be True or False."
        for field in _POSITIVE_INTS + _INTS:
            if not _is_int(getattr(self, field)):
                yield f"{field}={getattr(self, field)!r} must be an integer."
        betas = self.adam_betas
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2
                and all(_is_number(b) and 0 <= b < 1 for b in betas)):
            yield f"adam_betas={betas!r} must be two numbers in [0, 1), e.g. (0.9, 0.999)."
        if self.micro_batch_size is not None and not _is_int(self.micro_batch_size):
            yield f"micro_batch_size={self.micro_batch_size!r} must be a positive integer or None."

    def _model_and_env_errors(self):
        """Model settings and environment arguments by name: a typo fails here, not at the first train()."""
        model_config = self.model_config
        unknown = set(model_config) - set(DEFAULT_MODEL_CONFIG) - set(self._model_config_auto_includes)
        if unknown:
            yield f"model_config has unknown keys {sorted(unknown)}; accepted: {sorted(DEFAULT_MODEL_CONFIG)}."
        model = model_config.get("model")
        if isinstance(model, str) and model not in BUILT_IN_MODELS and not os.path.isdir(os.path.expanduser(model)):
            # A path (./x, /x, ~/x) that is no folder, or a hub id with the hub switched off: it cannot load.
            offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
            if model.startswith((".", "/", "~")) or (offline and not _in_hub_cache(model)):
                yield (f"model={model!r} is no local folder{' nor a cached hub id (HF_HUB_OFFLINE)' * offline}: "
                       f"give a folder saved with save_pretrained, a Hugging Face id, or one of {list(BUILT_IN_MODELS)}.")
        if model_config.get("critic") not in CRITIC_TYPES:
            yield f"model_config['critic']={model_config.get('critic')!r}: choose one of {list(CRITIC_TYPES)}."
        if str(model_config.get("dtype")).removeprefix("torch.") not in MODEL_DTYPES:
            yield f"model_config['dtype']={model_config.get('dtype')!r}: choose one of {list(MODEL_DTYPES)}."
        try:
            if lora_settings(model_config.get("lora")) and not peft_available():
                yield PEFT_MISSING
        except ValueError as error:
            yield str(error)
        yield from _env_config_errors("env_config", self.env, self.env_config)
        yield from self._mixture_errors()

    def _mixture_errors(self):
        """``train_envs`` and ``validation_envs``: each entry's keys, environment and count; unique names; the
        training groups adding up to ``num_groups``; ``env`` being the first training environment."""
        entries = {}
        for field, count_key in (("train_envs", "groups"), ("validation_envs", "states")):
            items = getattr(self, field)
            if items is None:
                continue
            if not isinstance(items, (list, tuple)) or not items:
                yield f"{field}={items!r} must be a non-empty list of dicts (see StarPOConfig.environment), or None."
                continue
            errors = []
            for i, item in enumerate(items):
                errors += _entry_errors(f"{field}[{i}]", item, count_key, required=field == "train_envs")
            yield from errors
            if errors:
                continue
            entries[field] = [_entry(item, count_key, self.validation_size) for item in items]
            names = [e.name for e in entries[field]]
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                yield (f"{field}: the names {repeated} are used twice; give each entry of one id its own "
                       "\"name\" (metrics and outputs tell them apart by it).")
        if entries.get("train_envs"):
            training = entries["train_envs"]
            total = sum(e.count for e in training)
            if total != self.num_groups:
                yield (f"train_envs: the groups add up to {total}, but num_groups={self.num_groups}; set "
                       f"num_groups={total} in .training() or change the groups.")
            if (self.env, dict(self.env_config)) != (training[0].env, training[0].env_config):
                yield (f"env={self.env!r} (env_config={dict(self.env_config)}) is not train_envs[0] "
                       f"({training[0].env!r}, {training[0].env_config}): with train_envs, env is the first training "
                       "environment; leave env out of .environment(train_envs=...).")
        by_name = {}
        for e in entries.get("train_envs", []) + entries.get("validation_envs", []):
            if by_name.setdefault(e.name, (e.env, e.env_config)) != (e.env, e.env_config):
                yield (f"the name {e.name!r} stands for two different environments in train_envs and validation_envs;"
                       " one name, one environment (its metrics would mix).")

    def _kept_groups_rule(self) -> str:
        """How ``num_kept_groups`` was counted, for error messages."""
        if self.rollout_filter in REFERENCE_STRATEGIES:
            return (f"rollout_filter={self.rollout_filter!r}, rollout_filter_value={self.rollout_filter_value} of "
                    f"num_groups={self.num_groups}")
        if self.rollout_filter_per_env and self.is_mixture:
            return (f"each train_envs entry's groups x rollout_filter_ratio={self.rollout_filter_ratio}, rounded up, "
                    "summed: rollout_filter_per_env=True")
        return f"num_groups={self.num_groups} x rollout_filter_ratio={self.rollout_filter_ratio}, rounded up"

    def _batch_shape_errors(self):
        """The kept batch must split into minibatches and, group by group, over the learners."""
        if self.rollout_filter_per_env and next(self._mixture_errors(), None):
            return  # the kept batch is counted from train_envs, whose own errors are reported
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            yield f"micro_batch_size={self.micro_batch_size} must be a positive integer or None."
        runners = max(1, self.num_env_runners)
        if self.num_groups < runners:
            yield f"num_groups={self.num_groups} is less than num_env_runners={self.num_env_runners}: some would idle."
        kept = self.kept_batch_size
        if kept is None:
            return  # the count varies: the learner splits each batch into optimizer_steps(rows) minibatches
        # Each remote learner takes whole groups (a group never straddles two learners) and the same number of them.
        learners = max(1, self.num_learners)
        if self.num_kept_groups % learners:
            yield (f"the rollout filter keeps {self.num_kept_groups} groups ({self._kept_groups_rule()}), which do "
                   f"not split evenly over num_learners={self.num_learners}: make the kept groups a multiple of "
                   "num_learners.")
        if self.context_window != "full":
            return  # rows are turns, as many as the episodes play: never fewer than the kept trajectories
        if self.minibatch_size is not None:
            if self.minibatch_size > kept:
                yield (f"minibatch_size={self.minibatch_size} is more than the {kept} trajectories the rollout "
                       f"filter keeps ({self._kept_groups_rule()}, x group_size={self.group_size}): lower "
                       "minibatch_size or keep more groups.")
            elif self.updates_per_rollout_batch != 1 and self.updates_per_rollout_batch * self.minibatch_size != kept:
                yield (f"minibatch_size={self.minibatch_size} and updates_per_rollout_batch="
                       f"{self.updates_per_rollout_batch} disagree: {kept} kept trajectories make "
                       f"{kept / self.minibatch_size:g} minibatches; set only one of them.")
        if self.updates_per_rollout_batch > kept:
            yield (f"updates_per_rollout_batch={self.updates_per_rollout_batch} is more than the {kept} kept "
                   "trajectories: each optimizer step needs at least one.")

    def _sentinel_errors(self):
        from ..sentinel import as_rule

        if self.collapse_diagnostics_interval < 0:
            yield (f"collapse_diagnostics_interval={self.collapse_diagnostics_interval} must be >= 0 (0 switches the "
                   "probe off).")
        if self.collapse_subsample < 2:
            yield f"collapse_subsample={self.collapse_subsample} must be >= 2: cross-scoring compares prompts."
        if self.sentinel_max_rollbacks < 0:
            yield f"sentinel_max_rollbacks={self.sentinel_max_rollbacks} must be >= 0."
        if not isinstance(self.sentinel_rules, (list, tuple)):
            yield f"sentinel_rules={self.sentinel_rules!r} must be a list of rllib_ragen.sentinel.Rule."
            return
        rules = []
        for item in self.sentinel_rules:
            try:
                rules.append(as_rule(item))
            except ValueError as error:
                yield f"sentinel_rules: {error}"
        for rule in rules:
            yield from (f"sentinel_rules: {error}" for error in rule.errors())
            ratio = rule.knobs.get("rollout_filter_ratio")
            if isinstance(ratio, (int, float)) and 0 < ratio <= 1:
                if self.rollout_filter not in ("std", "reversed_std"):
                    yield (f"sentinel_rules: {rule.label}: knobs['rollout_filter_ratio'] has no effect with "
                           f"rollout_filter={self.rollout_filter!r}; set rollout_filter='std' or drop the knob.")
                probe = copy.copy(self)
                probe.rollout_filter_ratio = ratio
                yield from (f"sentinel_rules: {rule.label}: after its rollback, {error}"
                            for error in probe._batch_shape_errors())
        labels = [r.label for r in rules]
        if len(set(labels)) != len(labels):
            yield "sentinel_rules: two rules have the same name; give each its own (Rule(name=...))."

    def _inference_errors(self):
        if self.inference_backend not in INFERENCE_BACKENDS and not callable(self.inference_backend):
            yield (f"inference_backend={self.inference_backend!r}: choose one of {sorted(INFERENCE_BACKENDS)}, "
                   "register yours with register_inference_backend, or pass a callable "
                   "(model, tokenizer, config) -> InferenceBackend.")
        if self.num_gpus_per_env_runner > 0 and self.num_env_runners == 0 and not torch.cuda.is_available():
            yield (f"num_gpus_per_env_runner={self.num_gpus_per_env_runner} with num_env_runners=0: the driver "
                   "samples, and it sees no CUDA device. Set num_gpus_per_env_runner=0 to sample on the CPU.")
        if self.inference_backend == "vllm":
            if not vllm_available():
                yield VLLM_MISSING
            # vLLM's kernels give log-probs within ~1e-3 of the learner's; the PPO ratio must start at exactly 1.
            if not self.recompute_logprobs:
                yield ("recompute_logprobs=False with inference_backend='vllm': vLLM's log-probs differ slightly "
                       "from the learner's, so the PPO ratio needs the learner's own; set recompute_logprobs=True.")
            lora = self.model_config.get("lora")
            rank = lora.get("r", 0) if isinstance(lora, dict) else 0  # its type is checked with the model's
            if isinstance(rank, int) and rank > VLLM_LORA_RANKS[-1]:
                yield (f"model_config['lora']['r']={rank} with inference_backend='vllm': vLLM serves adapters "
                       f"up to rank {VLLM_LORA_RANKS[-1]}; lower r or use inference_backend='hf'.")
            unknown = set(self.vllm_engine_config) - VLLM_ENGINE_OPTIONS
            if unknown:
                yield f"vllm_engine_config has unknown keys {sorted(unknown)}; known: {sorted(VLLM_ENGINE_OPTIONS)}."


def _is_known_env(env) -> bool:
    ensure_registered(env)  # another package's game ("gem/...", "textarena/...") is registered when first named
    return isinstance(env, type) or env in registered_text_envs()


def _lr_schedule_errors(schedule):
    """The rates of RLlib's learning-rate schedule ([[timestep, lr], ...]; RLlib checks its shape, not its rates):
    each finite and > 0, or the policy trains on NaN or by gradient ascent from that timestep on."""
    for pair in schedule:
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            step, rate = pair
            if not _is_number(rate) or not math.isfinite(rate) or rate <= 0:
                yield f"lr={schedule!r}: the rate {rate!r} at timestep {step!r} must be a finite number > 0."


def _env_config_errors(field: str, env, env_config):
    if not isinstance(env_config, dict):
        yield f"{field}={env_config!r} must be a dict of the environment's constructor arguments."
        return
    accepted = env_arguments(env) if _is_known_env(env) else None
    if accepted is not None and set(env_config) - accepted:
        yield (f"{field} has unknown keys {sorted(set(env_config) - accepted)} for {env!r}; "
               f"accepted: {sorted(accepted)}.")
    elif isinstance(env, str) and (env in BUILT_IN_TEXT_ENVS or env == REMOTE_ENV_ID):
        # The built-in environments check their arguments' types and ranges when built (cheaply: no level is drawn
        # before a reset): build one here, so a bad value is named now rather than in a worker at build time.
        try:
            make_text_env(env, **env_config).close()
        except (ValueError, TypeError) as error:
            yield f"{field} for {env!r}: {error}"


def _entry_errors(where: str, item, count_key: str, required: bool):
    """The errors of one ``train_envs`` / ``validation_envs`` entry, each naming ``where`` it is."""
    field = where.split("[")[0]
    if not isinstance(item, dict):
        yield f"{where}={item!r} must be a dict with keys {list(ENV_ENTRY_KEYS[field])}."
        return
    unknown = set(item) - set(ENV_ENTRY_KEYS[field])
    if unknown:
        yield f"{where} has unknown keys {sorted(unknown)}; accepted: {list(ENV_ENTRY_KEYS[field])}."
    if "env" not in item or not _is_known_env(item["env"]):
        yield (f"{where}['env']={item.get('env')!r} is not a registered text environment; pick one of "
               f"{registered_text_envs()} or register yours with rllib_ragen.register_text_env.")
    else:
        yield from _env_config_errors(f"{where}['env_config']", item["env"], item.get("env_config", {}))
    if "name" in item and (not isinstance(item["name"], str) or not item["name"]):
        yield f"{where}['name']={item['name']!r} must be a non-empty string."
    if required and count_key not in item:
        yield f"{where} needs {count_key!r}: the groups of this environment in each training step."
    elif count_key in item and (not _is_int(item[count_key]) or item[count_key] < 1):
        yield f"{where}[{count_key!r}]={item[count_key]!r} must be a positive integer."


def _entry(item: dict, count_key: str, default_count: int | None) -> EnvEntry:
    return EnvEntry(name=item.get("name") or env_name(item["env"]), env=item["env"],
                    env_config=dict(item.get("env_config") or {}), count=int(item.get(count_key, default_count)))
