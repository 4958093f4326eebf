"""Every metric name the package logs, in one place (no Ray, no torch).

Where they appear in ``Algorithm.train()``'s result, RLlib's layout:

- ``env_runners/``: the training rollout. RLlib's standard ``episode_return_mean``, ``episode_len_mean`` (turns),
  ``num_episodes`` and ``num_env_steps_sampled``, plus ours per environment (``{env_id}/success``, ...) and pooled
  (``rollout/success``, ...).
- ``evaluation/env_runners/``: the same for the fixed validation set, plus ``iteration`` (when it was played).
- ``learners/default_policy/``: the update (``actor/``, ``critic/``, ``perf/``, ``rollout/logprob_gap_*``).
- top level: the update's preparation (``rollout_filter/``, ``update/``), the driver's timers (``time/``), the
  echo-trap diagnostics (``collapse/``) and the sentinel (``sentinel/``).
"""

# ---- per-environment rollout metrics: f"{env_id}/{NAME}" and f"{POOLED}/{NAME}" -------------------------------
POOLED = "rollout"  # the pooled row of every per-environment metric: "rollout/success"
SUCCESS = "success"
PASS_AT = "pass@{group_size}"
NUM_ACTIONS = "num_actions"
NUM_TURNS = "num_turns"
VALID_ACTION_RATE = "valid_action_rate"
EFFECTIVE_ACTION_RATE = "effective_action_rate"
FORMAT_ERROR_RATE = "format_error_rate"
# Share of the checkable claims about the state in the reasoning that hold (TextEnv.reasoning_claims); logged only
# where the environment checked some.
REASONING_GROUNDED = "reasoning_grounded"
RESPONSE_TOKENS_PER_TURN = "response_tokens_per_turn"
RETURN_MEAN = "return_mean"
TRUNCATED_RATE = "truncated_rate"
NUM_TRAJECTORIES = "num_trajectories"

# RLlib's standard env-runner metrics, filled from the same rollout (an episode's length counts its turns).
EPISODE_RETURN_MEAN = "episode_return_mean"
EPISODE_LEN_MEAN = "episode_len_mean"
NUM_EPISODES = "num_episodes"
NUM_ENV_STEPS_SAMPLED = "num_env_steps_sampled"

# Rollout bookkeeping (under env_runners/): events the rollout handled and counted, summed over env runners.
ENV_ERRORS = "rollout/env_errors"  # an environment raised; its trajectory is dropped
ENV_TIMEOUTS = "rollout/env_timeouts"  # a reset or step outlived its timeout; trajectory dropped, env replaced
NONFINITE_REWARDS = "rollout/nonfinite_rewards"  # an environment paid NaN or inf; its trajectory is dropped
CONTROL_TEXTS = "rollout/control_texts_neutralised"  # a special token's text in env text; made ordinary text
UNENCODABLE_TEXTS = "rollout/unencodable_texts"  # observation text UTF-8 cannot encode; the characters replaced
PROMPTS_TOO_LONG = "rollout/prompts_too_long"  # a first prompt over max_context_tokens; the episode is not played
# An observation longer than max_context_tokens tokens could spell: not tokenized; its episode ends there, truncated.
OBSERVATIONS_TOO_LONG = "rollout/observations_too_long"
# Moves of a reply past max_actions_per_turn: never played (ParsedReply.num_dropped).
ACTIONS_DROPPED = "rollout/actions_dropped"
# A seat of a multi-agent game that ended before its first turn (a forfeit on the first move): it has no trajectory.
SEATS_NEVER_MOVED = "rollout/seats_never_moved"
GAME_OUTCOMES = ("win", "draw", "loss", "unfinished")  # per seat of a game: {env}/{seat}/{outcome}_rate
# Self-play against a league of frozen snapshots (starpo/league.py): the learner's {outcome}_rate against them, the
# games that rate counts, and the snapshots held.
LEAGUE = "league"
LEAGUE_GAMES = "league/games"
LEAGUE_SNAPSHOTS = "league/snapshots"
# Separate policies (starpo/policies.py): what the driver measures of one policy, under policies/<id>/<metric>.
POLICIES = "policies"


TOOL_RESULTS_CUT = "rollout/tool_results_cut"  # an in-process tool's result over max_observation_chars, cut to it
# Not a metric: the first failed environment call of a rollout, as text (its cause, should every episode fail).
FIRST_ENV_ERROR = "first_env_error"
# Tool mode (rollout/tools.py): calls read from replies; those that could not run (unknown tool, arguments the schema
# refuses, over a limit) or whose tool failed; call blocks that could not be read.
TOOL_CALLS = "rollout/tool_calls"
TOOL_CALL_ERRORS = "rollout/tool_call_errors"
MALFORMED_TOOL_CALLS = "rollout/malformed_tool_calls"
ROLLOUT_COUNTERS = (
    ENV_ERRORS,
    ENV_TIMEOUTS,
    NONFINITE_REWARDS,
    UNENCODABLE_TEXTS,
    CONTROL_TEXTS,
    PROMPTS_TOO_LONG,
    OBSERVATIONS_TOO_LONG,
    TOOL_CALLS,
    TOOL_CALL_ERRORS,
    MALFORMED_TOOL_CALLS,
    TOOL_RESULTS_CUT,
    ACTIONS_DROPPED,
    SEATS_NEVER_MOVED,
)
CURRICULUM_STAGE = "curriculum/stage"  # the training rollout's curriculum stage; the stage count once they are over
ENV_RUNNER_RESTARTS = "rollout/env_runner_restarts"  # remote env runners that died mid-rollout and were restarted
WEIGHTS_SEQ_NO = "perf/weights_seq_no"
TIME_ROLLOUT = "time/rollout_s"
TIME_GENERATE = "time/generate_s"

# Validation (under evaluation/env_runners/).
VALIDATION_ITERATION = "iteration"

# ---- the update's preparation on the driver (top level) -------------------------------------------------------
FILTER_REWARD_STD = "rollout_filter/reward_std"
FILTER_REWARD_MEAN = "rollout_filter/reward_mean"
FILTER_REWARD_MAX = "rollout_filter/reward_max"
FILTER_KEPT_REWARD_STD = "rollout_filter/kept_reward_std"
FILTER_KEPT_REWARD_MEAN = "rollout_filter/kept_reward_mean"
FILTER_KEPT_REWARD_MAX = "rollout_filter/kept_reward_max"
FILTER_KEPT_GROUPS = "rollout_filter/kept_groups"
FILTER_KEPT_SHARE = "rollout_filter/kept_share"  # kept groups / groups
FILTER_ZERO_VARIANCE_GROUPS = "rollout_filter/zero_variance_groups"  # groups whose episodes all returned the same
FILTER_EMPTY_STEPS = "rollout_filter/empty_steps"  # consecutive iterations whose filter kept nothing (no update)
TRAINING_ROWS = "update/rows"  # learner rows: kept trajectories, or their turns' samples with a context window
KEPT_TRAJECTORIES = "update/kept_trajectories"
ROLE_BASELINE = "update/role_baseline"  # rae: each role's running baseline after the batch, role_baseline/<role>
RESPONSE_LENGTH = "update/response_length"  # generated tokens per kept trajectory

# One-step off-policy rollouts (max_policy_lag=1; top level).
POLICY_LAG = "rollout/policy_lag"  # updates between the policy that sampled the trained batch and the learner's

# Driver timers (top level).
TIME_SAMPLE = "time/sample_s"
TIME_UPDATE = "time/update_s"
TIME_SYNC = "time/sync_s"
TIME_WEIGHT_LOAD = "time/weight_load_s"
TIME_VALIDATE = "time/validate_s"  # seconds this iteration spent validating (the "before RL" one included)
VALIDATIONS_IN_ITERATION = "time/validations"  # how many validations those seconds hold
# Bytes the last weight sync moved: 0 when the env runner plays the learner's own tensors (one process, same device).
SYNC_BYTES = "perf/sync_bytes"
# The algorithm's process, its peak resident memory so far in GiB (the learner and, with no remote env runners, the
# sampler; validation included).
PEAK_RSS = "perf/peak_rss_gib"

# ---- the learner (under learners/default_policy/) -------------------------------------------------------------
PG_LOSS = "actor/pg_loss"
# Clip fractions of the policy's tokens. verl's names differ: its `pg_clipfrac` is ours; its `pg_clipfrac_lower`
# is the dual-clip fraction, our `pg_clipfrac_dual` (so no metric here is called "lower").
PG_CLIPFRAC = "actor/pg_clipfrac"  # the clip acted: ratio above 1 + eps_high with A > 0, or below 1 - eps_low, A < 0
PG_CLIPFRAC_HIGH = "actor/pg_clipfrac_high"  # ratio above 1 + eps_high with A > 0
PG_CLIPFRAC_LOW = "actor/pg_clipfrac_low"  # ratio below 1 - eps_low with A < 0
PG_CLIPFRAC_DUAL = "actor/pg_clipfrac_dual"  # A < 0 and the dual clip's bound -A c was taken
PPO_KL = "actor/ppo_kl"  # mean(log pi_old - log pi) over the update's tokens: k1, verl's `ppo_kl`
APPROX_KL_K3 = "actor/approx_kl_k3"  # mean((rho - 1) - log rho): the k3 estimate, >= 0, lower variance
RATIO_MEAN = "actor/ratio_mean"
ENTROPY = "actor/entropy"
KL_TO_REFERENCE = "actor/kl_to_reference"
FIRST_STEP_LOGPROB_DEVIATION = "actor/first_step_logprob_deviation"
GRAD_NORM = "{optimizer}/grad_norm"  # optimizer: "actor" or "critic"
VF_LOSS = "critic/vf_loss"
VF_CLIPFRAC = "critic/vf_clipfrac"
EXPLAINED_VARIANCE = "critic/explained_variance"
VALUES_MEAN = "critic/values_mean"
LOGPROB_GAP_MAX = "rollout/logprob_gap_max"
LOGPROB_GAP_MEAN = "rollout/logprob_gap_mean"
# Off-policy correction (max_policy_lag=1): w = min(pi_old / pi_behaviour, cap) on each sampled token.
IMPORTANCE_WEIGHT_MEAN = "off_policy/importance_weight_mean"
IMPORTANCE_WEIGHT_TRUNCATED = "off_policy/truncated_share"  # tokens whose weight the cap cut
UPDATE_TOKENS_PER_S = "perf/update_tokens_per_s"
OPTIMIZER_STEPS = "perf/optimizer_steps"
SKIPPED_OPTIMIZER_STEPS = "perf/skipped_optimizer_steps"  # non-finite loss or gradient: weights left untouched


def env_metric(env_id: str, name: str) -> str:
    """The name of a per-environment metric: ``env_metric("rllib_ragen/Sokoban-v0", SUCCESS)``."""
    return f"{env_id}/{name}"


def policy_metric(policy_id: str, key: str) -> str:
    """Where the driver logs policy ``policy_id``'s own value of metric ``key`` (separate policies)."""
    return f"{POLICIES}/{policy_id}/{key}"


# ---- echo-trap diagnostics (``collapse.py``) ----------------------------------------------------------------------
# Every iteration, from the training rollout (top level).
THINK_TOKENS_PER_TURN = "collapse/think_tokens_per_turn"  # reply tokens inside <think>...</think>
ANSWER_TOKENS_PER_TURN = "collapse/answer_tokens_per_turn"  # reply tokens of the <answer> block, tags included
DISTINCT_2 = "collapse/distinct_2"  # distinct token bigrams over all bigrams of the batch's replies
DISTINCT_2_IN_GROUP = "collapse/distinct_2_in_group"  # the same within each group, averaged over groups
REPEAT_RATE = "collapse/repeat_rate"  # replies identical to another reply of their group at the same turn
REASONING_ENTROPY = "collapse/reasoning_entropy"  # nats, of the first turn's <think> text over the batch's episodes
# Every collapse_diagnostics_interval iterations, on the learner, before the update (top level).
RETRIEVAL_ACCURACY = "collapse/retrieval_accuracy"  # a reasoning's own prompt explains it best (chance 1/m)
MI_ESTIMATE = "collapse/mi_estimate"  # InfoNCE bound on I(prompt; reasoning), nats, at most log m
CROSS_SCORE_MARGIN = "collapse/cross_score_margin"  # own prompt's log-likelihood minus the best other's, nats
# With the probe's first run in every window of gradient_analysis_interval iterations (top level).
GRAD_NORM_BUCKET = "collapse/grad_norm_{bucket}"  # the policy gradient's norm on one reward-variance bucket
BUCKET_SHARE = "collapse/groups_{bucket}"  # share of the rollout's groups in that bucket
TIME_COLLAPSE_PROBE = "time/collapse_probe_s"  # the probe's seconds (top level)

# The sentinel (top level).
SENTINEL_FIRINGS = "sentinel/firings"  # rules fired this iteration
SENTINEL_TOTAL_FIRINGS = "sentinel/total_firings"  # over the run
SENTINEL_ROLLBACKS = "sentinel/rollbacks"  # rollbacks over the run
SENTINEL_LR_FACTOR = "sentinel/lr_factor"  # the actor learning rate's multiplier, after any rollbacks
SENTINEL_STOP = "sentinel/stop"  # 1.0 once a stop rule fired
SENTINEL_EVENTS = "sentinel/events"  # this iteration's firings as a JSON list (rule, value, action, what was done)
