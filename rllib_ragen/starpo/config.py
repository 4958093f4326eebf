"""StarPO's configuration: an RLlib ``AlgorithmConfig`` whose knobs are declared, with RAGEN's StarPO-S
defaults, kinds and ranges, in ``knobs.py``; its presets (``presets.py``); and ``validate()``, which checks every
knob against its row and then the rules across knobs (``config_rules.py``). The algorithm itself is in ``starpo.py``.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from ray._common.deprecation import DEPRECATED_VALUE
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.annotations import override
from ray.util.debug import log_once

from ..envs import register_carried, registrations_of
from ..objectives import ADVANTAGE_ESTIMATORS, AdvantageSettings, FilterSettings, fixed_kept_groups
from ..rollout.backends import SamplingParams
from ..rollout.rollout_config import RolloutConfig
from .config_rules import rule_errors
from .environments import ConfigEnvironments
from .knobs import KNOB_SECTIONS, KNOBS, RLLIB_DEFAULT, RLLIB_FIELDS, STARPO_S_DEFAULTS, knob_errors, settings_from
from .llm_rl_module import DEFAULT_MODEL_CONFIG, CausalLMRLModule
from .policies import ConfigPolicies
from .presets import PRESET_LABEL, PRESETS, VARIANT_LABEL

__all__ = ["KNOB_SECTIONS", "STARPO_S_DEFAULTS", "StarPOConfig"]

# Fields RLlib itself leaves at its deprecated-value marker (-1): they stay out of the state, as RLlib wants.
_RLLIB_PLACEHOLDERS = frozenset(
    k
    for k, v in AlgorithmConfig().__dict__.items()
    if isinstance(v, int) and not isinstance(v, bool) and v == DEPRECATED_VALUE
)


class StarPOConfig(ConfigPolicies, ConfigEnvironments, AlgorithmConfig):
    """Configuration of :class:`StarPO`; defaults are RAGEN's StarPO-S on the ``tiny`` CPU model.

    Method knobs are set with ``.training(...)`` (each declared in ``starpo/knobs.py``); the model with
    ``.rl_module(model_config={"model": ..., "dtype": ..., "critic": "separate" | "head", "lora": {"r": 16}})``;
    named settings with ``.preset(name)`` (``PRESETS``).
    """

    def __init__(self, algo_class=None):
        from .starpo import StarPO  # the algorithm imports this config

        super().__init__(algo_class=algo_class or StarPO)
        for knob in [*KNOBS.values(), *RLLIB_FIELDS.values()]:
            if knob.default is not RLLIB_DEFAULT:  # RAGEN's values; none shared between configs
                setattr(self, knob.name, copy.deepcopy(knob.default))
        self.env = RolloutConfig.env
        # Environment mixtures (see environment()): None trains and validates on env alone.
        self.train_envs: list[dict] | None = None
        self.validation_envs: list[dict] | None = None
        # Training stages of env_config changes (see environment()): None trains on env_config throughout.
        self.curriculum: list[dict] | None = None
        # The user's environment registrations, carried to Ray's workers (rllib_ragen.envs.registrations_of).
        self.text_env_registrations: dict = {}
        self._model_config = dict(DEFAULT_MODEL_CONFIG)

    @override(AlgorithmConfig)
    def environment(
        self, env=NotProvided, *, train_envs=NotProvided, validation_envs=NotProvided, curriculum=NotProvided, **kwargs
    ) -> "StarPOConfig":
        """RLlib's ``environment()``, plus environment mixtures (RAGEN's environment tags).

        Args:
            env: the one environment to train and validate on (a registered text-env id or a TextEnv subclass),
                with ``env_config``. With ``train_envs`` it is the first training environment, and set to it.
            train_envs: train on several environments at once: a list of ``{"env": id, "groups": g,
                "env_config": {...}, "name": str}``; each training step plays ``g`` groups of each, in this
                order, and the groups add up to ``num_groups``. ``name`` (default: the id) is what the metrics
                (``<name>/success``) and outputs call it; two entries of one id need their own names.
            validation_envs: validate on these instead of the training environments: a list of ``{"env": id,
                "states": n, "env_config": {...}, "name": str}``, ``n`` validation states each (default
                ``validation_size``, seeds from ``validation_seed_start``). None: each training environment,
                ``validation_size`` states.
            curriculum: train on easier settings first: a list of stages ``{"iterations": n, "env_config":
                {...}}``; the training rollouts of a stage's ``n`` iterations play ``env`` with ``env_config``
                updated by the stage's, in order, and every later one with ``env_config`` as given (with one
                environment only, not ``train_envs``). Validation always plays ``env_config`` as given.
                ``curriculum/stage`` in the results counts the stages passed. None: no stages.
        """
        if train_envs is not NotProvided:
            self.train_envs = copy.deepcopy(train_envs)
            first = train_envs[0] if isinstance(train_envs, (list, tuple)) and train_envs else None
            if isinstance(first, dict) and env is NotProvided:  # (a malformed list is reported by validate())
                env = first.get("env", self.env)
                kwargs.setdefault("env_config", dict(first.get("env_config") or {}))
        if validation_envs is not NotProvided:
            self.validation_envs = copy.deepcopy(validation_envs)
        if curriculum is not NotProvided:
            self.curriculum = copy.deepcopy(curriculum)
        super().environment(env, **kwargs)
        named = [
            self.env,
            *(
                entry.get("env")
                for entry in [*(self.train_envs or []), *(self.validation_envs or [])]
                if isinstance(entry, dict)
            ),
        ]
        self.text_env_registrations = registrations_of(named)
        return self

    @override(AlgorithmConfig)
    def training(self, **kwargs) -> "StarPOConfig":
        """Set StarPO's knobs and RLlib's training fields. Defaults: RAGEN's StarPO-S (arXiv 2504.20073).

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
                0 (RAGEN's): such a move costs only the move. Validation returns include it too; success
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
                False (RAGEN's): they repeat each other's draws, so a group of N bandit pulls compares
                one coin flip with the safe arm, and a group's advantage carries one draw's noise.
            self_play: training rollouts play every seat of the environment's game with the policy, its role in its
                prompt (``rollout/seats.py``): ``env`` names a built-in game (``rllib_ragen/TicTacToe-v0``,
                ``rllib_ragen/KuhnPoker-v0``), ``env_config["game_config"]`` its settings; each group's
                trajectories are grouped per seat, so every seat's advantages have their own baseline. Validation
                plays the same id as a text environment: one seat against ``env_config["opponent"]`` (Multi-agent
                games page).
            league_interval: with self-play, freeze the learner's policy into a league of opponents at iteration 0 (the
                warm start) and every ``league_interval`` iterations after; each training group then plays self-play
                or, drawn uniformly with the snapshots, the learner in one seat against one snapshot, whose seats
                are not trained (``starpo/league.py``). 0: pure self-play (SPIRAL's).
            league_size: the newest snapshots the league keeps (each a copy of the policy's weights, in memory and in
                every checkpoint).
            env_reset_timeout_s, env_step_timeout_s: seconds one environment ``reset()`` or ``step()`` may take.
                A later one is an isolated environment failure: its episode is dropped, counted as
                ``rollout/env_timeouts``, and the environment replaced, so a hung environment (a dead game server,
                an infinite loop) never hangs ``train()``.
            context_window: what the policy reads before each reply. ``"full"`` (RAGEN's default): the whole
                conversation, one append-only token sequence per episode, trained as one row. ``"last_k_turns"``:
                the system prompt and the instructions, then the last ``context_window_turns`` turns (the current
                one included), re-rendered each turn; ``"single_turn"``: the instructions and the current state
                only (RAGEN's ``context_window_mode`` limited_multi_turn / single_turn). With a window each turn is
                its own training row (its prompt and its sampled reply, exact to the token), and the context no
                longer grows with the episode; advantages stay the episode's, each turn's placed on its own row.
            context_window_turns: k of ``"last_k_turns"``, at least 2 (k = 1 is ``"single_turn"``); RAGEN's
                ``max_context_window``. None with the other windows.
            action_separator: what stands between actions in an answer, ``"||"`` (RAGEN's); None: the whole answer
                is one action, passed to the environment as written (a query or a sentence that may contain
                ``||``), with ``max_actions_per_turn=1``. The format hint at the end of each observation says so.
            tool_call_format: how the policy writes tool calls for an environment with tools (``TextEnv.tools``): a
                name in ``rllib_ragen.rollout.tools.TOOL_CALL_FORMATS``, ``"hermes"`` (Qwen2.5/Qwen3's
                ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``).
            inference_backend: a name in ``INFERENCE_BACKENDS`` (``starpo/inference_engines.py``): ``"hf"``
                (batched KV-cached sampling in the env runner), ``"vllm"`` (vLLM engines as Ray actors, shared by
                all env runners, new weights loaded after every update; needs vLLM), one you registered with
                ``register_inference_backend``; or a callable ``(model, tokenizer, config) -> InferenceBackend``.
            inference_batch_size: prompts per generation batch of the HF backend.
            max_concurrent_episodes: play a rollout or a validation in waves of at most this many episodes (whole
                groups, at least one), each to its end before the next: the KV cache then holds one wave's
                conversations, which bounds the memory of a large validation (256 SmolLM2 episodes of FrozenLake
                held about 8 GiB at once). With the HF backend, waves of ``inference_batch_size`` decode as many
                rows per step as one large batch does, in its chunks. A wave after the first samples from seeds
                of its own, so the sampled episodes differ from those played all at once. None (default): every
                episode at once.
            rollout_dtype: the dtype the env runners' copy of the policy samples in (the HF backend), and
                ``evaluate`` plays a saved policy in; the learner keeps its weights in the model's dtype. ``"bfloat16"``
                where the CPU computes it natively (AVX512-BF16 or AMX: ``rllib_ragen.hardware.cpu_computes_bfloat16``
                says) or on a GPU, with float32 weights and ``autocast_dtype="bfloat16"`` in the learner: the
                sampler's log-probs then differ from the learner's by bfloat16's rounding (``rollout/logprob_gap_*``),
                and the learner's own recomputed ones are the old log-probs (``recompute_logprobs``). None (default):
                the model's dtype.
            num_inference_engines: vLLM engines (Ray actors, ``tensor_parallel_size`` GPUs each).
            vllm_engine_config: keyword arguments of :class:`~rllib_ragen.rollout.vllm_backend.VLLMEngine`:
                ``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``, ``enforce_eager``; plus
                ``num_gpus_per_engine`` to override the GPUs each engine's bundle asks for.
            advantage_estimator: a name in ``rllib_ragen.objectives.ADVANTAGE_ESTIMATORS``: ``"gae"`` (PPO with a
                critic: StarPO-S), ``"bi_level_gae"`` (TRICO: GAE across turns with ``gamma_turn``, then inside
                each turn with ``gamma_token``), ``"turn_gae"`` (one GAE advantage per turn, from the turn-end
                values), ``"gigpo"`` (GRPO plus ``gigpo_omega`` x a step advantage among the group's turns that saw
                the same state), ``"grpo"`` (return normalised within its group), ``"brpo"`` (normalised over the
                batch), ``"raw"`` (the return itself), ``"rae"`` (the return minus its role's running mean: SPIRAL's
                RAE, a role being a seat of a game), or one you registered with
                ``register_advantage_estimator``. Estimators that need a critic run on the learner, the others on
                the driver. The turn-aware ones want ``turn_level_rewards=True``.
            grpo_normalize_std: divide by the group's (batch's) std for grpo/brpo. Off gives mean-only
                advantages, which avoid amplifying tiny differences in nearly-uniform groups.
            lambda_: GAE lambda of every GAE-family estimator (1.0: with gamma 1 the advantage is return minus
                value).
            whiten_advantages: whiten the advantages of estimators with a critic (gae, bi_level_gae, turn_gae)
                over the batch's generated tokens (masked mean, Bessel std), as RAGEN does. With several
                learners too: their statistics are summed over the shards (an all-reduce).
            gamma_turn, gamma_token: ``bi_level_gae``'s discounts across turns and inside a turn (the
                VAGEN's: 0.95 and 1.0); ``turn_gae`` discounts with ``gamma_turn``. ``gae`` uses ``gamma``.
            gigpo_step_gamma: discount of GiGPO's step returns.
            gigpo_omega: weight of GiGPO's step-level advantage (0: GRPO).
            rae_decay: how slowly ``rae``'s baselines move: each trajectory moves its role's by (1 - decay) x the gap.
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
                (``ceil(ratio x its groups)`` each) instead of across the whole batch (False, RAGEN's), where
                one environment's groups can all be dropped from an update. The same with one environment.
            clip_ratio_low, clip_ratio_high: PPO clip range [1 - low, 1 + high]; 0.2 / 0.28 is "clip-higher",
                which leaves room for rare tokens to gain probability.
            dual_clip: bound c on the loss of negative-advantage tokens (> 1), or None to switch it off.
            kl_coeff: weight of KL(policy || frozen initial policy); 0 (StarPO-S) does not load the reference policy.
            kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (low-variance, >= 0).
            entropy_coeff: entropy bonus weight.
            loss_aggregation: ``"token-mean"`` (every token weighs the same), ``"seq-mean-token-mean"`` (every
                trajectory weighs the same) or ``"seq-mean-token-sum"``.
            loss_mask: which sampled tokens the policy loss (and its entropy and KL terms) trains: ``"all"``
                (RAGEN's), ``"no_think"`` (all but the reasoning inside ``<think>...</think>``) or
                ``"answer"`` (the ``<answer>...</answer>`` block alone). Template and observation tokens are never
                trained. With ``"answer"`` the format penalty cannot train a malformed tag outside the answer block,
                so format errors can grow. The advantage recursion and the value loss run over the
                ``advantage_mask``'s tokens, which hold every sampled token: rewards sit on each turn's last one.
            advantage_mask: which tokens ``gae``'s recursion steps through and the critic is trained on (VAGEN's
                "GAE mask"): ``"sampled"`` (the policy's own tokens, skipping the environment's: VAGEN's and RAGEN's)
                or ``"sampled_and_observations"`` (the observation tokens between turns are steps too, with no
                reward, so with gamma * lambda_ < 1 credit fades across them: VAGEN's ablation without
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
            updates_per_rollout_batch: optimizer steps per rollout batch and epoch (RAGEN's implicit
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
                MI estimate; each reward-variance bucket's share of groups) every k iterations, on the current
                rollout before its update (0: never). The cheap reply diagnostics run every iteration.
            gradient_analysis_interval: with the probe's first run in every window of k iterations, also measure
                the policy-gradient norm of each reward-variance bucket (a backward pass over the kept batch, about
                as long again as the rest of the probe; RAGEN's ``gradient_analysis_every`` is 50 too). 0, or
                ``collapse_diagnostics_interval=0``, switches it off.
            collapse_subsample: first-turn reasonings cross-scored by the probe (m; m x m scoring passes).
            sentinel_rules: :class:`~rllib_ragen.sentinel.Rule` objects watched after every iteration; see
                ``rllib_ragen/sentinel.py``.
            sentinel_max_rollbacks: rollbacks allowed per run; a rollback rule firing after that stops the run.
            sentinel_snapshot_interval: with a rollback rule, keep the weights and optimizer state of every k-th
                healthy iteration (on local disk) as rollback points.
            sentinel_rollback_depth: a rollback restores the oldest of the last this many snapshots. The
                signals can trail a sudden collapse by a few iterations (docs: Echo trap), so the
                newest "healthy" snapshot may already hold collapsed weights.
        """
        knobs = {k: kwargs.pop(k) for k in list(kwargs) if k in KNOBS}
        super().training(**kwargs)  # RLlib's own fields; an unknown keyword is its TypeError
        for key, value in knobs.items():
            if value is not NotProvided:
                setattr(self, key, value)
        return self

    # The signature help() and editors show: every knob by name, in the table's order.
    training.__signature__ = inspect.Signature(
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=NotProvided) for name in KNOBS),
            inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
        ]
    )

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
        clip 0.2/0.2, no filter), ``"ragen-gpu"`` (RAGEN's model and scale, on GPUs) or ``"smollm2-gpu"``
        (SmolLM2-135M-Instruct on one GPU)."""
        if name not in PRESETS:
            raise ValueError(f"preset {name!r}: choose one of {sorted(PRESETS)}.")
        for setter, arguments in PRESETS[name].items():
            getattr(self, setter)(**arguments)
        return self

    @override(AlgorithmConfig)
    def update_from_dict(self, config_dict: dict) -> "StarPOConfig":
        """RLlib's, except that the ``"preset"`` and ``"variant"`` keys are labels and set nothing: a Tune grid over
        presets (``--grid '{"preset": [...]}'``) or named variants (``--grid '{"variant": {name: {...}}}'``) names
        each trial's with them, and resolves their fields beside them (``rllib_ragen.jobs.run.named_grid``). Set
        as an attribute, ``preset`` would hide the :meth:`preset` method."""
        return super().update_from_dict(
            {k: v for k, v in config_dict.items() if k not in (PRESET_LABEL, VARIANT_LABEL)}
        )

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

    def model_load_error(self) -> str | None:
        """Why the policy model cannot load in this process (None: it may). Not part of ``validate()``: on a
        cluster this process's disk is not the workers', so the driver asks it only where it loads the model."""
        from ..rollout.models import model_source_error

        return model_source_error(self.model_config.get("model"))

    @property
    def sampling_dtype(self) -> str:
        """The dtype rollouts play the policy in: ``rollout_dtype``, else the model's."""
        return self.rollout_dtype or self.model_config.get("dtype", "float32")

    def rollout_config(self) -> RolloutConfig:
        named = {e.name: (e.env, e.env_config) for e in self.training_environments() + self.validation_environments()}
        environments = (
            tuple((name, env, env_config) for name, (env, env_config) in named.items()) if self.is_mixture else ()
        )
        return settings_from(
            self, RolloutConfig, env=self.env, env_config=dict(self.env_config), environments=environments
        )

    def sampling_params(self, validation: bool = False) -> SamplingParams:
        return SamplingParams(
            temperature=self.validation_temperature if validation else self.temperature,
            max_new_tokens=self.max_new_tokens_per_turn,
        )

    def advantage_settings(self) -> AdvantageSettings:
        return settings_from(self, AdvantageSettings)

    def filter_settings(self, keep_ratio: float | None = None) -> FilterSettings:
        """The rollout filter, ``keep_ratio`` replacing ``rollout_filter_ratio`` (a sentinel rollback's)."""
        return settings_from(self, FilterSettings, **({} if keep_ratio is None else {"ratio": keep_ratio}))

    @property
    def num_kept_groups(self) -> int | None:
        """Groups left for the update after the rollout filter (per environment: the sum of each one's share);
        None when the filter keeps a number that depends on the rollout (``fixed_kept_groups``)."""
        settings = self.filter_settings()
        counts = (
            [e.count for e in self.training_environments()]
            if self.rollout_filter_per_env and self.is_mixture
            else [self.num_groups]
        )
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
        if not (self.enable_rl_module_and_learner and self.enable_env_runner_and_connector_v2):
            raise ValueError(
                "Invalid StarPOConfig:\n  - api_stack: StarPO runs on RLlib's new API stack alone "
                "(RLModule, Learner, EnvRunner); drop the config.api_stack(...) call that turned it off."
            )
        # RLlib's notice that this algorithm runs on the new API stack offers the old one, which StarPO does not have.
        log_once(f"{self.algo_class.__name__}_on_new_api_stack")
        super().validate()
        kinds, values = knob_errors(self)  # each knob's kind and range (knobs.py)
        # The rules compare values: a string or a NaN would crash them, so they wait for every kind to be right.
        errors = kinds or values + list(rule_errors(self))
        if errors:
            raise ValueError("Invalid StarPOConfig:\n  - " + "\n  - ".join(errors))
