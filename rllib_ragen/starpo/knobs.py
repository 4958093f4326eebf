"""StarPO's knobs, each declared once: its section, default, kind and range, in one table (:data:`KNOBS`).

Everything else derives from a row: ``StarPOConfig``'s defaults and its ``training()`` keywords, the kind and range
checks of ``validate()`` (:meth:`Knob.kind_error`, :meth:`Knob.value_error`), the job flags and their
``--help-all`` sections, and the settings objects of the lower layers (``RolloutConfig``, ``AdvantageSettings``,
``FilterSettings``): a row that feeds one (``into``) takes its default from that class and fills its field. What
a knob does is its ``Args:`` entry in ``StarPOConfig.training``'s docstring, the one description (the flags' help
text). ``validate()`` adds the rules across knobs (``starpo/config_rules.py``). To add a knob: a row here, an
``Args:`` line, and the code that reads it (docs: Contributing).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Collection

import numpy as np

from ..objectives.rollout_filter import RATIO_RANGE as FILTER_RATIO_RANGE
from ..objectives import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_MASKS,
    AGGREGATIONS,
    FILTER_MODES,
    FILTER_TYPES,
    KL_ESTIMATORS,
    TOP_P_MODES,
    AdvantageSettings,
    FilterSettings,
)
from ..ranges import (
    ABOVE_ONE,
    ABOVE_ZERO_TO_ONE,
    AT_LEAST_ONE,
    AT_LEAST_TWO,
    BELOW_ONE,
    NON_NEGATIVE,
    NON_POSITIVE,
    POSITIVE,
    SEEDS,
    UNIT_INTERVAL,
    Range,
)
from ..rollout.rollout_config import CONTEXT_WINDOWS, RolloutConfig
from ..rollout.protocol import LOSS_MASK_REGIONS
from ..rollout.trajectory import SeedSchedule
from .inference_engines import INFERENCE_BACKENDS

INT, NUMBER, BOOL, CHOICE, OTHER = "integer", "number", "boolean", "choice", "other"  # a knob's kind
RLLIB_DEFAULT = object()  # an RLlib field whose default stays RLlib's
AUTOCAST_DTYPES = (None, "bfloat16")  # the learner's forward passes (autocast_dtype)
ROLLOUT_DTYPES = (None, "float32", "bfloat16")  # the sampler's copy of the policy (rollout_dtype)
MAX_VALIDATION_STATES = 10_000  # per validation environment: every state's episode is held at once
VLLM_ENGINE_OPTIONS = {
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "enforce_eager",
    "num_gpus_per_engine",
}


def is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclasses.dataclass(frozen=True)
class Knob:
    """One knob.

    Attributes:
        name: its keyword in ``training()`` (an RLlib field's own name for :data:`RLLIB_FIELDS`).
        section: its group in the flags' ``--help-all`` (None: an RLlib field).
        default: its value in a new ``StarPOConfig``; taken from ``into``'s class when that is given.
        kind: ``INT``, ``NUMBER`` (finite), ``BOOL``, ``CHOICE`` (one of ``options``) or ``OTHER`` (``check``).
        range: the numbers it may take (a :class:`~rllib_ragen.ranges.Range`, e.g. ``NON_NEGATIVE``).
        why: what the range or choice means, ending its error message.
        optional: None is a value too (it switches the feature off, or means "the strategy's own").
        options: the choices of a ``CHOICE`` knob (a registry is read when checked, so registrations count), or
            the only values of an ``INT`` one.
        check: for ``OTHER`` knobs, ``value -> error or None``; with ``check_is_kind`` it runs with the kinds (the
            rules need it passed: they iterate ``sentinel_rules``), else with the ranges.
        check_is_kind: see ``check``.
        into: ``(settings class, field)`` this knob fills, e.g. ``(RolloutConfig, "max_turns")``.
    """

    name: str
    section: str | None
    default: Any
    kind: str
    range: Range | None = None
    why: str = ""
    optional: bool = False
    options: Collection | None = None
    check: Callable[[Any], str | None] | None = None
    check_is_kind: bool = False
    into: tuple[type, str] | None = None

    def kind_error(self, value) -> str | None:
        """Whether ``value`` is of the knob's kind (checked first: the ranges compare numbers)."""
        if value is None and self.optional:
            return None
        none = " or None" * self.optional
        if self.kind == INT and not is_int(value):
            return f"{self.name}={value!r} must be an integer{none}."
        if self.kind == NUMBER and not (is_number(value) and math.isfinite(value)):
            return f"{self.name}={value!r} must be a finite number{none}."
        if self.kind == BOOL and not isinstance(value, (bool, np.bool_)):
            return f"{self.name}={value!r} must be {'True, False or None' if self.optional else 'True or False'}."
        if self.kind == CHOICE:  # the rules look a choice up (in a registry): it must be one
            return self._options_error(value)
        if self.check is not None and self.check_is_kind:
            return self.check(value)
        return None

    def value_error(self, value) -> str | None:
        """Whether ``value`` (of the right kind) is one of the options and in the range."""
        if self.kind != CHOICE and self.options is not None:
            return self._options_error(value)
        if self.check is not None and not self.check_is_kind:
            return self.check(value)
        if self.range is None or (value is None and self.optional) or value in self.range:
            return None
        if self.kind == INT and self.range == AT_LEAST_ONE and not self.why:
            return f"{self.name}={value} must be a positive integer."
        verb = "lie in" if self.range.is_interval else "be"
        return f"{self.name}={value} must {verb} {self.range}{self.why}."

    def _options_error(self, value) -> str | None:
        if _one_of(value, self.options):
            return None
        return f"{self.name}={value!r}: choose one of {_shown(self.options)}{self.why}."


def _one_of(value, options) -> bool:
    try:
        return value in options
    except TypeError:  # an unhashable value (a list) in a registry's keys
        return False


def _shown(options) -> list:
    try:
        return sorted(options)
    except TypeError:  # None among strings
        return list(options)


def _knob(name, default, kind, range=None, **details) -> Knob:
    into = details.get("into")
    if into is not None:
        if default is not None:
            raise ValueError(f"knob {name}: its default is {into[0].__name__}.{into[1]}'s; state it there only.")
        default = getattr(into[0], into[1])  # a dataclass's class attribute is its field's default
    return Knob(name, None, default, kind, range, **details)


def _section(title: str, *knobs: Knob) -> tuple[Knob, ...]:
    return tuple(dataclasses.replace(k, section=title) for k in knobs)


def _adam_betas_error(betas) -> str | None:
    if isinstance(betas, (list, tuple)) and len(betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in betas):
        return None
    return f"adam_betas={betas!r} must be two numbers in [0, 1), e.g. (0.9, 0.999)."


def _inference_backend_error(backend) -> str | None:
    if backend in INFERENCE_BACKENDS or callable(backend):
        return None
    return (
        f"inference_backend={backend!r}: choose one of {sorted(INFERENCE_BACKENDS)}, register yours with "
        "register_inference_backend, or pass a callable (model, tokenizer, config) -> InferenceBackend."
    )


def _vllm_engine_config_error(options) -> str | None:
    if not isinstance(options, dict):
        return f"vllm_engine_config={options!r} must be a dict of VLLMEngine's keyword arguments."
    unknown = set(options) - VLLM_ENGINE_OPTIONS
    return (
        f"vllm_engine_config has unknown keys {sorted(unknown)}; known: {sorted(VLLM_ENGINE_OPTIONS)}."
        if unknown
        else None
    )


def _action_separator_error(separator) -> str | None:
    """A short string that cannot be read as a tag, or None (each answer is one action)."""
    if separator is None:
        return None
    if (
        not isinstance(separator, str)
        or not separator.strip()
        or len(separator) > 16
        or "<" in separator
        or ">" in separator
    ):
        return (
            f"action_separator={separator!r} must be a short string (1 to 16 characters, not only spaces, "
            "without < or >, which would read as a tag), e.g. '||', or None: each answer is then one action."
        )
    return None


def _tool_call_format_error(name) -> str | None:
    from ..rollout.tools import TOOL_CALL_FORMATS

    return (
        None
        if isinstance(name, str) and name in TOOL_CALL_FORMATS
        else (
            f"tool_call_format={name!r} is not a registered tool-call format; known: {sorted(TOOL_CALL_FORMATS)} "
            "(rllib_ragen.rollout.tools.TOOL_CALL_FORMATS)."
        )
    )


def _rules_list_error(rules) -> str | None:
    return (
        None
        if isinstance(rules, (list, tuple))
        else f"sentinel_rules={rules!r} must be a list of rllib_ragen.sentinel.Rule."
    )


def _lr_error(lr) -> str | None:
    """A rate, or RLlib's schedule ``[[timestep, rate], ...]`` (RLlib checks its shape, not its rates): each rate
    finite and > 0, or the policy trains on NaN or by gradient ascent."""
    if not isinstance(lr, (list, tuple)):
        if not is_number(lr) or not math.isfinite(lr):
            return f"lr={lr!r} must be a finite number > 0."
        return None if lr > 0 else f"lr={lr} must be > 0."
    for pair in lr:
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            step, rate = pair
            if not is_number(rate) or not math.isfinite(rate) or rate <= 0:
                return f"lr={lr!r}: the rate {rate!r} at timestep {step!r} must be a finite number > 0."
    return None


_R, _A, _F = RolloutConfig, AdvantageSettings, FilterSettings
_PENALTY = ": a positive value would reward what it penalises"
_TIMEOUT = " seconds (the longest one environment call may take)"

# The method's knobs with RAGEN's StarPO-S values (the RAGEN paper, arXiv 2504.20073, and its public
# training configs), by section, in the order of the flags' --help-all.
KNOB_TABLE: tuple[Knob, ...] = (
    *_section(
        "rollout",
        _knob("num_groups", 8, INT, AT_LEAST_ONE),
        _knob("group_size", 16, INT, AT_LEAST_ONE),
        _knob("max_turns", None, INT, AT_LEAST_ONE, into=(_R, "max_turns")),
        _knob("max_actions_per_turn", None, INT, AT_LEAST_ONE, into=(_R, "max_actions_per_turn")),
        _knob("max_actions_per_episode", None, INT, AT_LEAST_ONE, into=(_R, "max_actions_per_episode")),
        _knob("temperature", 1.0, NUMBER, POSITIVE, why=" for training rollouts (their log-probs are trained on)"),
        _knob("validation_temperature", 0.5, NUMBER, NON_NEGATIVE, why=" (0 is greedy)"),
        _knob("max_new_tokens_per_turn", 400, INT, AT_LEAST_ONE),
        _knob("format_penalty", None, NUMBER, NON_POSITIVE, why=_PENALTY, into=(_R, "format_penalty")),
        _knob(
            "ineffective_action_penalty",
            None,
            NUMBER,
            NON_POSITIVE,
            why=_PENALTY,
            into=(_R, "ineffective_action_penalty"),
        ),
        _knob(
            "ungrounded_reasoning_penalty",
            None,
            NUMBER,
            NON_POSITIVE,
            into=(_R, "ungrounded_reasoning_penalty"),
            why=": it is charged per action not stated truly, and a positive value would pay for wrong reasoning",
        ),
        _knob("enable_thinking", None, BOOL, into=(_R, "enable_thinking")),
        _knob("max_context_tokens", None, INT, AT_LEAST_ONE, into=(_R, "max_context_tokens")),
        _knob("independent_transitions", None, BOOL, into=(_R, "independent_transitions")),
        _knob("self_play", False, BOOL),
        _knob("league_interval", 0, INT, NON_NEGATIVE, why=" (0: no league, pure self-play)"),
        _knob("league_size", 4, INT, AT_LEAST_ONE),
        _knob("env_reset_timeout_s", None, NUMBER, POSITIVE, why=_TIMEOUT, into=(_R, "env_reset_timeout_s")),
        _knob("env_step_timeout_s", None, NUMBER, POSITIVE, why=_TIMEOUT, into=(_R, "env_step_timeout_s")),
        _knob("context_window", None, CHOICE, options=CONTEXT_WINDOWS, into=(_R, "context_window")),
        _knob("context_window_turns", None, INT, optional=True, into=(_R, "context_window_turns")),
        _knob(
            "action_separator",
            None,
            OTHER,
            optional=True,
            check=_action_separator_error,
            check_is_kind=True,
            into=(_R, "action_separator"),
        ),
        _knob(
            "tool_call_format",
            None,
            OTHER,
            check=_tool_call_format_error,
            check_is_kind=True,
            into=(_R, "tool_call_format"),
        ),
    ),
    *_section(
        "inference",
        _knob("inference_backend", "hf", OTHER, check=_inference_backend_error),
        _knob("inference_batch_size", 128, INT, AT_LEAST_ONE),
        _knob(
            "max_concurrent_episodes",
            None,
            INT,
            AT_LEAST_ONE,
            why=", or None (every episode at once)",
            optional=True,
            into=(_R, "max_concurrent_episodes"),
        ),
        _knob(
            "rollout_dtype",
            None,
            CHOICE,
            options=ROLLOUT_DTYPES,
            why=" (None: the model's dtype, model_config['dtype'])",
        ),
        _knob("num_inference_engines", 1, INT, AT_LEAST_ONE),
        _knob("vllm_engine_config", {}, OTHER, check=_vllm_engine_config_error),
    ),
    *_section(
        "advantages and rollout filter",
        _knob("advantage_estimator", "gae", CHOICE, options=ADVANTAGE_ESTIMATORS),
        _knob("grpo_normalize_std", None, BOOL, into=(_A, "normalize_std")),
        _knob("lambda_", None, NUMBER, UNIT_INTERVAL, into=(_A, "lam")),
        _knob("turn_level_rewards", False, BOOL),
        _knob("whiten_advantages", None, BOOL, into=(_A, "whiten")),
        _knob("gamma_turn", None, NUMBER, ABOVE_ZERO_TO_ONE, into=(_A, "gamma_turn")),
        _knob("gamma_token", None, NUMBER, ABOVE_ZERO_TO_ONE, into=(_A, "gamma_token")),
        _knob("gigpo_step_gamma", None, NUMBER, ABOVE_ZERO_TO_ONE, into=(_A, "step_gamma")),
        _knob("gigpo_omega", None, NUMBER, NON_NEGATIVE, why=" (0 is GRPO)", into=(_A, "omega")),
        _knob("rae_decay", 0.95, NUMBER, BELOW_ONE),  # SPIRAL's; 1 would leave the baseline at 0
        _knob("rollout_filter", None, CHOICE, options=FILTER_MODES, into=(_F, "mode")),
        # The filter keeps ceil(ratio * groups) groups: 0 would keep nothing, > 1 more groups than exist.
        _knob("rollout_filter_ratio", None, NUMBER, FILTER_RATIO_RANGE, into=(_F, "ratio")),
        _knob("rollout_filter_per_env", False, BOOL),
        # RAGEN's own filter strategies (rollout_filter="top_p", ...) and their settings
        _knob("rollout_filter_value", None, NUMBER, optional=True, into=(_F, "value")),
        _knob("rollout_filter_type", None, CHOICE, options=FILTER_TYPES, into=(_F, "filter_type")),
        _knob("rollout_filter_include_zero", None, BOOL, optional=True, into=(_F, "include_zero")),
        _knob("rollout_filter_top_p_mode", None, CHOICE, options=TOP_P_MODES, into=(_F, "top_p_mode")),
        _knob("rollout_filter_selection_eps", None, NUMBER, NON_NEGATIVE, into=(_F, "selection_eps")),
        _knob("rollout_filter_empty_stop_steps", 5, INT, AT_LEAST_ONE),
    ),
    *_section(
        "losses",
        _knob("clip_ratio_low", 0.2, NUMBER, BELOW_ONE),
        _knob("clip_ratio_high", 0.28, NUMBER, NON_NEGATIVE),
        # Dual clipping bounds a negative-advantage token's loss by c * |A|: c <= 1 would undercut the PPO clip.
        _knob("dual_clip", 3.0, NUMBER, ABOVE_ONE, why=", or None to switch it off", optional=True),
        _knob("kl_coeff", 0.0, NUMBER, NON_NEGATIVE),
        _knob("kl_estimator", "k3", CHOICE, options=KL_ESTIMATORS),
        _knob("entropy_coeff", 0.001, NUMBER, NON_NEGATIVE),
        _knob("loss_aggregation", "token-mean", CHOICE, options=AGGREGATIONS),
        _knob("loss_mask", "all", CHOICE, options=LOSS_MASK_REGIONS),
        _knob("value_clip", 0.5, NUMBER, POSITIVE, why=", or None to switch it off", optional=True),
        _knob("vf_loss_coeff", 1.0, NUMBER, NON_NEGATIVE),
        _knob("advantage_mask", "sampled", CHOICE, options=ADVANTAGE_MASKS),
        _knob("recompute_logprobs", True, BOOL),
    ),
    *_section(
        "optimisation",
        _knob("critic_lr", 1e-5, NUMBER, POSITIVE),  # <= 0 would train by gradient ascent, or not at all
        _knob("weight_decay", 0.01, NUMBER, NON_NEGATIVE),
        _knob("adam_betas", (0.9, 0.999), OTHER, check=_adam_betas_error),
        _knob(
            "micro_batch_size",
            None,
            INT,
            AT_LEAST_ONE,
            why=" row, or None (the whole minibatch at once)",
            optional=True,
        ),
        _knob(
            "autocast_dtype",
            None,
            CHOICE,
            options=AUTOCAST_DTYPES,
            why=" (float16 would need a loss scaler; bfloat16 does not)",
        ),
        _knob("updates_per_rollout_batch", 1, INT, AT_LEAST_ONE),
        _knob("max_consecutive_skipped_steps", 5, INT, AT_LEAST_ONE),
        # one-step off-policy rollouts: overlap iteration k+1's generation with iteration k's update
        _knob(
            "max_policy_lag",
            0,
            INT,
            options=(0, 1),
            why=" (0: synchronous, 1: one-step off-policy; longer lags are not implemented)",
        ),
        _knob("importance_weight_cap", 2.0, NUMBER, AT_LEAST_ONE, why=" (1 drops the correction's upside)"),
    ),
    *_section(
        "validation and seeds",
        _knob("validation_interval", 10, INT, NON_NEGATIVE, why=" (0 switches validation off)"),
        _knob(
            "validation_size",
            256,
            INT,
            Range(1, MAX_VALIDATION_STATES),
            why=" (a validation plays its states in one rollout, held in memory: play more in parts, each from "
            "its own validation_seed_start)",
        ),
        _knob("validation_group_size", 1, INT, AT_LEAST_ONE),
        _knob("validate_before_training", True, BOOL),
        _knob("train_seed_start", None, INT, NON_NEGATIVE, why=" (a reset seed)", into=(SeedSchedule, "next_train")),
        _knob("validation_seed_start", 123, INT, NON_NEGATIVE, why=" (a reset seed)"),
    ),
    *_section(
        "echo-trap diagnostics and the sentinel",  # collapse.py, sentinel.py
        _knob("collapse_diagnostics_interval", 5, INT, NON_NEGATIVE, why=" (0 switches the probe off)"),
        _knob("gradient_analysis_interval", 50, INT, NON_NEGATIVE, why=" (0 switches it off)"),
        _knob("collapse_subsample", 8, INT, AT_LEAST_TWO, why=": cross-scoring compares prompts"),
        _knob("sentinel_rules", [], OTHER, check=_rules_list_error, check_is_kind=True),
        _knob("sentinel_max_rollbacks", 3, INT, NON_NEGATIVE),
        _knob("sentinel_snapshot_interval", 1, INT, AT_LEAST_ONE),
        _knob("sentinel_rollback_depth", 3, INT, AT_LEAST_ONE),
    ),
)
KNOBS: dict[str, Knob] = {k.name: k for k in KNOB_TABLE}

_GPUS = " (0: the CPU; a fraction shares a GPU)"
# RLlib's own fields that StarPO sets a default for (RAGEN's) or checks (RLlib takes them as given).
RLLIB_FIELDS: dict[str, Knob] = {
    k.name: k
    for k in (
        _knob("lr", 1e-6, OTHER, check=_lr_error),  # the actor's; a rate or RLlib's schedule
        _knob("gamma", None, NUMBER, ABOVE_ZERO_TO_ONE, into=(_A, "gamma")),  # 1: trajectory-level credit
        _knob("grad_clip", 1.0, NUMBER, POSITIVE, why=", or None to switch it off", optional=True),
        _knob("grad_clip_by", "global_norm", OTHER),
        # learner rows per optimizer step; None: the kept batch split into updates_per_rollout_batch steps
        _knob(
            "minibatch_size",
            None,
            INT,
            AT_LEAST_ONE,
            why=" trajectory, or None (the kept batch split evenly)",
            optional=True,
        ),
        _knob("num_epochs", 1, INT, AT_LEAST_ONE),
        _knob("shuffle_batch_per_epoch", True, OTHER),
        _knob("seed", RLLIB_DEFAULT, INT, SEEDS, why=" (numpy's seeds), or be None", optional=True),
        _knob("num_env_runners", RLLIB_DEFAULT, INT, NON_NEGATIVE),
        _knob("num_learners", RLLIB_DEFAULT, INT, NON_NEGATIVE),
        _knob("num_gpus_per_env_runner", RLLIB_DEFAULT, NUMBER, NON_NEGATIVE, why=_GPUS),
        _knob("num_gpus_per_learner", RLLIB_DEFAULT, NUMBER, NON_NEGATIVE, why=_GPUS),
    )
}

# The flags' sections, and the StarPO-S defaults by name (rllib_ragen.STARPO_S_DEFAULTS).
KNOB_SECTIONS: dict[str, dict[str, Any]] = {
    section: {k.name: k.default for k in KNOB_TABLE if k.section == section}
    for section in dict.fromkeys(k.section for k in KNOB_TABLE)
}
STARPO_S_DEFAULTS: dict[str, Any] = {k.name: k.default for k in KNOB_TABLE}


def knob_errors(config) -> tuple[list[str], list[str]]:
    """Each knob and checked RLlib field of ``config`` against its row: the errors of kind (numbers finite,
    integers integers, ...), and of option or range among the knobs of the right kind."""
    rows = [*KNOB_TABLE, *RLLIB_FIELDS.values()]
    kinds = {k.name: e for k in rows if (e := k.kind_error(getattr(config, k.name))) is not None}
    values = [e for k in rows if k.name not in kinds and (e := k.value_error(getattr(config, k.name))) is not None]
    return list(kinds.values()), values


def settings_from(config, settings_class: type, **fields):
    """``settings_class`` (RolloutConfig, AdvantageSettings, FilterSettings, SeedSchedule) filled from the knobs
    that feed it, ``fields`` given beside them (or over them)."""
    fed = {
        k.into[1]: getattr(config, k.name)
        for k in [*KNOB_TABLE, *RLLIB_FIELDS.values()]
        if k.into is not None and k.into[0] is settings_class
    }
    return settings_class(**{**fed, **fields})
