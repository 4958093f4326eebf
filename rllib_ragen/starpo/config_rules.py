"""The rules of ``StarPOConfig.validate()`` across knobs, each with its reason. A knob's own kind and range are
its row in ``knobs.py``; these run once every knob has passed that."""

from __future__ import annotations

import copy

import torch

from ..envs.base import checks_reasoning_claims
from ..envs.tool_env import ToolTextEnv
from ..objectives import RAGEN_STRATEGIES
from ..objectives.rollout_filter import RATIO_RANGE as FILTER_RATIO_RANGE
from ..rollout.lora import PEFT_MISSING, lora_settings, peft_available
from ..rollout.vllm_backend import VLLM_LORA_RANKS, VLLM_MISSING, vllm_available
from .environments import env_class, environment_errors, is_known_env, mixture_errors
from .knobs import KNOBS, is_int
from .llm_rl_module import CRITIC_TYPES, DEFAULT_MODEL_CONFIG
from .policies import separate_policy_errors

MODEL_DTYPES = ("float32", "bfloat16", "float16")


def rule_errors(config):
    """Every rule's errors, in the order a reader meets the knobs."""
    yield from _estimator_errors(config)
    yield from _reasoning_penalty_errors(config)
    yield from _filter_strategy_errors(config)
    yield from _context_window_errors(config)
    yield from _action_separator_errors(config)
    yield from _tool_environment_errors(config)
    yield from _self_play_errors(config)
    yield from separate_policy_errors(config)
    yield from batch_shape_errors(config)
    yield from _off_policy_errors(config)
    yield from _sentinel_errors(config)
    yield from _inference_errors(config)
    yield from _model_errors(config)
    yield from environment_errors(config)


def _estimator_errors(config):
    if config.advantage_mask != "sampled" and config.advantage_estimator != "gae":
        yield (
            f"advantage_mask={config.advantage_mask!r} applies to advantage_estimator='gae' only (the turn-level "
            f"estimators recurse over turns, the critic-free ones not at all); with "
            f"advantage_estimator={config.advantage_estimator!r} set advantage_mask='sampled'."
        )
    # A group of one has nothing to be compared with: every advantage would be 0.
    if config.advantage_estimator in ("grpo", "gigpo") and config.group_size < 2:
        yield (
            f"advantage_estimator={config.advantage_estimator!r} compares trajectories within a group: set "
            "group_size >= 2."
        )


def _reasoning_penalty_errors(config):
    penalty = config.ungrounded_reasoning_penalty
    if penalty == 0:
        return
    if not config.enable_thinking:
        yield (
            f"ungrounded_reasoning_penalty={penalty} charges what the <think> block says, and "
            "enable_thinking=False: set enable_thinking=True, or the penalty to 0."
        )
    silent = [
        e.name
        for e in config.training_environments()
        if is_known_env(e.env) and not checks_reasoning_claims(env_class(e.env))
    ]
    if silent:
        yield (
            f"ungrounded_reasoning_penalty={penalty}, but training environment(s) {silent} check no claims "
            "about their state (TextEnv.reasoning_claims), so every turn would be charged in full: train on "
            "ones that do (Sokoban, FrozenLake) or set the penalty to 0."
        )


def _tool_environment_errors(config):
    """Tool episodes (``rollout/tools.py``) keep the whole conversation in view and have no ``<answer>`` block. Known
    here for the tool environments whose class says so (``ToolTextEnv``); a served one is known once it answers."""
    if config.context_window == "full" and config.loss_mask != "answer":
        return
    if next(mixture_errors(config), None):
        return  # malformed train_envs: reported by environment_errors, and no list of environments to read
    with_tools = [
        e.name
        for e in config.training_environments()
        if is_known_env(e.env) and issubclass(env_class(e.env), ToolTextEnv)
    ]
    if not with_tools:
        return
    if config.context_window != "full":
        yield (
            f"context_window={config.context_window!r}, but training environment(s) {with_tools} are played with "
            "tools, whose episodes keep the whole conversation in view: set context_window='full'."
        )
    if config.loss_mask == "answer":
        yield (
            f"loss_mask='answer' trains the <answer> block, and the tool-call replies of {with_tools} have none: "
            "set loss_mask='all' or 'no_think'."
        )


_STRATEGY_KNOBS = (
    "rollout_filter_value",
    "rollout_filter_type",
    "rollout_filter_include_zero",
    "rollout_filter_top_p_mode",
)  # the settings of RAGEN's strategies alone


def _filter_strategy_errors(config):
    """RAGEN's strategies' settings: each given where it means something, and in its range."""
    mode, value = config.rollout_filter, config.rollout_filter_value
    if mode not in RAGEN_STRATEGIES:
        given = [
            f"{name}={getattr(config, name)!r}"
            for name in _STRATEGY_KNOBS
            if getattr(config, name) != KNOBS[name].default
        ]
        if given:
            yield (
                f"{', '.join(given)} set RAGEN's filter strategies, and rollout_filter={mode!r} is not one: "
                f"choose rollout_filter in {list(RAGEN_STRATEGIES)}, or leave them at their defaults "
                "(std's share is rollout_filter_ratio)."
            )
        return
    if value is None and mode != "snr_adaptive":
        yield f"rollout_filter={mode!r} needs rollout_filter_value (its threshold; RAGEN's top_p: 0.9)."
    elif value is not None and mode in ("top_p", "snr_adaptive", "top_k", "min_p") and value not in FILTER_RATIO_RANGE:
        yield f"rollout_filter_value={value} must lie in {FILTER_RATIO_RANGE} for rollout_filter={mode!r}."
    elif mode == "top_k_abs" and value is not None and (value < 1 or value != int(value)):
        yield f"rollout_filter_value={value} must be a whole number of groups >= 1 for rollout_filter='top_k_abs'."
    elif mode == "top_k_abs" and value is not None and value > config.num_groups:
        yield (
            f"rollout_filter_value={value:g} keeps more groups than a rollout has (num_groups="
            f"{config.num_groups}), so rollout_filter='top_k_abs' would keep them all: lower it to at most "
            "num_groups, or set rollout_filter='none' to keep every group."
        )
    if mode == "snr_adaptive":
        if config.rollout_filter_include_zero:
            yield (
                "rollout_filter='snr_adaptive' drops zero-variance groups by definition: leave "
                "rollout_filter_include_zero at None, or use rollout_filter='top_p' to keep them."
            )
        if config.rollout_filter_type != "largest" or config.rollout_filter_top_p_mode != "linear":
            yield (
                "rollout_filter='snr_adaptive' is linear top-p over the largest variances (RAGEN-2): use "
                "rollout_filter='top_p' for rollout_filter_type='smallest' or the softmax mode."
            )
    if mode != "top_p" and config.rollout_filter_top_p_mode != "linear":
        yield f"rollout_filter_top_p_mode={config.rollout_filter_top_p_mode!r} applies to rollout_filter='top_p' only."
    # RAGEN's score is the sample std: a group of one has none.
    if config.group_size < 2:
        yield f"rollout_filter={mode!r} scores each group by its reward std: set group_size >= 2."
    if config.num_kept_groups is None and config.num_learners > 1:
        yield (
            f"rollout_filter={mode!r} keeps a number of groups that varies from rollout to rollout, and "
            f"num_learners={config.num_learners} learners each need a share of whole groups: use one learner, "
            "or a filter that keeps a fixed number (std, top_k or top_k_abs with zero-variance groups "
            "included)."
        )


def _action_separator_errors(config):
    # Without a separator an answer is one action: a budget of several per reply could never be used.
    if config.action_separator is None and config.max_actions_per_turn != 1:
        yield (
            f"action_separator=None makes each answer one action, but max_actions_per_turn="
            f"{config.max_actions_per_turn}: set max_actions_per_turn=1, or give a separator."
        )


def _self_play_errors(config):
    if config.league_interval and not config.self_play:
        yield (
            f"league_interval={config.league_interval}: a league is of self-play's opponents; set self_play=True "
            "or league_interval=0."
        )
    if not config.self_play:
        return
    from ..envs.games import GAMES

    # Validation plays the same id as a text environment (one seat against a scripted opponent): built-in games.
    # validation_envs may name several opponents (random, minimax); training plays the one game.
    if config.train_envs is not None or config.env not in GAMES:
        yield (
            f"self_play=True plays a game's every seat and validates one seat against a scripted opponent: env "
            f"must name a built-in game ({sorted(GAMES)}), got env={config.env!r}"
            f"{' in a training mixture (train_envs)' if config.train_envs is not None else ''}. TextArena's games "
            "play through rllib_ragen.rollout.seats.play_games."
        )
    if config.max_actions_per_turn != 1:
        yield (
            f"self_play=True: a seat makes one move a turn; set max_actions_per_turn=1 "
            f"(got {config.max_actions_per_turn})."
        )
    if config.league_interval and config.env in GAMES:
        seats = len(GAMES[config.env].possible_agents)
        if seats != 2:
            yield (
                f"league_interval={config.league_interval}: the league's groups put the learner in one seat and a "
                f"snapshot in the other; {config.env} has {seats} seats. Use a two-seat game or league_interval=0."
            )
        if config.inference_backend != "hf":
            yield (
                f"league_interval={config.league_interval}: the snapshots are played by Hugging Face samplers of "
                f"each env runner's own; set inference_backend='hf' (got {config.inference_backend!r})."
            )


def _context_window_errors(config):
    window, turns = config.context_window, config.context_window_turns
    if window == "last_k_turns":
        if not is_int(turns) or turns < 2:
            yield (
                f"context_window='last_k_turns' needs context_window_turns >= 2 (the turns in view, the "
                f"current one included), got {turns!r}; for one turn use context_window='single_turn'."
            )
    elif turns is not None:
        yield (
            f"context_window_turns={turns!r} applies to context_window='last_k_turns' only (context_window={window!r})."
        )
    if window != "full" and config.advantage_mask != "sampled":
        yield (
            f"advantage_mask={config.advantage_mask!r} steps through the observation tokens between replies, "
            f"which a context_window={window!r} episode has in no single row: use advantage_mask='sampled'."
        )


def _kept_groups_rule(config) -> str:
    """How ``num_kept_groups`` was counted, for error messages."""
    if config.rollout_filter in RAGEN_STRATEGIES:
        return (
            f"rollout_filter={config.rollout_filter!r}, rollout_filter_value={config.rollout_filter_value} of "
            f"num_groups={config.num_groups}"
        )
    if config.rollout_filter_per_env and config.is_mixture:
        return (
            f"each train_envs entry's groups x rollout_filter_ratio={config.rollout_filter_ratio}, rounded up, "
            "summed: rollout_filter_per_env=True"
        )
    return f"num_groups={config.num_groups} x rollout_filter_ratio={config.rollout_filter_ratio}, rounded up"


def batch_shape_errors(config):
    """The kept batch must split into minibatches and, group by group, over the learners."""
    if config.rollout_filter_per_env and next(mixture_errors(config), None):
        return  # the kept batch is counted from train_envs, whose own errors are reported
    if config.num_groups < max(1, config.num_env_runners):
        yield (
            f"num_groups={config.num_groups} is less than num_env_runners={config.num_env_runners}: some would idle."
        )
    kept = config.kept_batch_size
    if kept is None:
        return  # the count varies: the learner splits each batch into optimizer_steps(rows) minibatches
    # Each remote learner takes whole groups (a group never straddles two learners) and the same number of them.
    if config.num_kept_groups % max(1, config.num_learners):
        yield (
            f"the rollout filter keeps {config.num_kept_groups} groups ({_kept_groups_rule(config)}), which do "
            f"not split evenly over num_learners={config.num_learners}: make the kept groups a multiple of "
            "num_learners."
        )
    if config.context_window != "full":
        return  # rows are turns, as many as the episodes play: never fewer than the kept trajectories
    if config.minibatch_size is not None:
        if config.minibatch_size > kept:
            yield (
                f"minibatch_size={config.minibatch_size} is more than the {kept} trajectories the rollout "
                f"filter keeps ({_kept_groups_rule(config)}, x group_size={config.group_size}): lower "
                "minibatch_size or keep more groups."
            )
        elif config.updates_per_rollout_batch != 1 and config.updates_per_rollout_batch * config.minibatch_size != kept:
            yield (
                f"minibatch_size={config.minibatch_size} and updates_per_rollout_batch="
                f"{config.updates_per_rollout_batch} disagree: {kept} kept trajectories make "
                f"{kept / config.minibatch_size:g} minibatches; set only one of them."
            )
    if config.updates_per_rollout_batch > kept:
        yield (
            f"updates_per_rollout_batch={config.updates_per_rollout_batch} is more than the {kept} kept "
            "trajectories: each optimizer step needs at least one."
        )


def _off_policy_errors(config):
    if config.max_policy_lag == 1:
        if config.num_env_runners < 1 and not config.in_evaluation:  # (RLlib's evaluation copy has none)
            yield (
                "max_policy_lag=1 overlaps the rollout on remote env runners with the local update: set "
                "num_env_runners >= 1 in .env_runners()."
            )
        if not config.recompute_logprobs:
            yield (
                "max_policy_lag=1 needs recompute_logprobs=True: the PPO ratio is taken against the learner's "
                "pre-update policy, and the behaviour policy's log-probs only weight it."
            )


def _sentinel_errors(config):
    from ..sentinel import as_rule

    rules = []
    for item in config.sentinel_rules:
        try:
            rules.append(as_rule(item))
        except ValueError as error:
            yield f"sentinel_rules: {error}"
    for rule in rules:
        yield from (f"sentinel_rules: {error}" for error in rule.errors())
        ratio = rule.knobs.get("rollout_filter_ratio")
        if isinstance(ratio, (int, float)) and 0 < ratio <= 1:
            if config.rollout_filter not in ("std", "reversed_std"):
                yield (
                    f"sentinel_rules: {rule.label}: knobs['rollout_filter_ratio'] has no effect with "
                    f"rollout_filter={config.rollout_filter!r}; set rollout_filter='std' or drop the knob."
                )
            probe = copy.copy(config)
            probe.rollout_filter_ratio = ratio
            yield from (
                f"sentinel_rules: {rule.label}: after its rollback, {error}" for error in batch_shape_errors(probe)
            )
    labels = [r.label for r in rules]
    if len(set(labels)) != len(labels):
        yield "sentinel_rules: two rules have the same name; give each its own (Rule(name=...))."


def _inference_errors(config):
    if config.num_gpus_per_env_runner > 0 and config.num_env_runners == 0 and not torch.cuda.is_available():
        yield (
            f"num_gpus_per_env_runner={config.num_gpus_per_env_runner} with num_env_runners=0: the driver "
            "samples, and it sees no CUDA device. Set num_gpus_per_env_runner=0 to sample on the CPU."
        )
    if config.inference_backend == "vllm":
        if not vllm_available():
            yield VLLM_MISSING
        # vLLM's kernels give log-probs within ~1e-3 of the learner's; the PPO ratio must start at exactly 1.
        if not config.recompute_logprobs:
            yield (
                "recompute_logprobs=False with inference_backend='vllm': vLLM's log-probs differ slightly "
                "from the learner's, so the PPO ratio needs the learner's own; set recompute_logprobs=True."
            )
        lora = config.model_config.get("lora")
        rank = lora.get("r", 0) if isinstance(lora, dict) else 0  # its type is checked with the model's
        if isinstance(rank, int) and rank > VLLM_LORA_RANKS[-1]:
            yield (
                f"model_config['lora']['r']={rank} with inference_backend='vllm': vLLM serves adapters "
                f"up to rank {VLLM_LORA_RANKS[-1]}; lower r or use inference_backend='hf'."
            )


def _model_errors(config):
    """Model settings by name, a typo failing here rather than at the first train(); autocast against the dtype.
    Whether the model's folder exists is asked where it loads (``rollout.models.model_source_error``): on a
    cluster the driver's disk is not the workers'."""
    model_config = config.model_config
    unknown = set(model_config) - set(DEFAULT_MODEL_CONFIG) - set(config._model_config_auto_includes)
    if unknown:
        yield f"model_config has unknown keys {sorted(unknown)}; accepted: {sorted(DEFAULT_MODEL_CONFIG)}."
    if model_config.get("critic") not in CRITIC_TYPES:
        yield f"model_config['critic']={model_config.get('critic')!r}: choose one of {list(CRITIC_TYPES)}."
    if not isinstance(model_config.get("activation_checkpointing", False), bool):
        yield (f"model_config['activation_checkpointing']={model_config['activation_checkpointing']!r}: True or False.")
    dtype = str(model_config.get("dtype")).removeprefix("torch.")
    if dtype not in MODEL_DTYPES:
        yield f"model_config['dtype']={model_config.get('dtype')!r}: choose one of {list(MODEL_DTYPES)}."
    elif config.autocast_dtype is not None and dtype != "float32":
        yield (
            f"autocast_dtype={config.autocast_dtype!r} with model_config['dtype']="
            f"{model_config.get('dtype')!r}: autocast keeps float32 weights and computes in bfloat16; "
            "with weights in a low precision already, set autocast_dtype=None (or dtype='float32')."
        )
    try:
        lora = lora_settings(model_config.get("lora"))
    except ValueError as error:
        yield str(error)
        return
    if lora and not peft_available():
        yield PEFT_MISSING
    base_dtype = lora and lora["base_dtype"]
    if base_dtype and base_dtype != dtype and config.autocast_dtype != base_dtype:
        yield (
            f"model_config['lora']['base_dtype']={base_dtype!r} with autocast_dtype={config.autocast_dtype!r}: "
            f"frozen {base_dtype} weights are read by the {dtype} model's products only under {base_dtype} "
            f"autocast; set autocast_dtype={base_dtype!r}, or base_dtype=None to keep them in {dtype}."
        )
