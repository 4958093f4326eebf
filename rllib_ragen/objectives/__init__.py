"""StarPO's math as pure torch functions on padded tensors: advantages, the rollout filter, losses. No Ray."""

from .advantages import (ADVANTAGE_ESTIMATORS, ADVANTAGE_MASKS, ONE_LEARNER, AdvantageEstimator,
                         AdvantageInputs, AdvantageSettings, Shards, advantage_recursion_mask, compute_advantages,
                         compute_batch_advantages, compute_bi_level_gae, compute_gae, compute_gigpo_step_advantages,
                         compute_group_advantages, compute_turn_gae, masked_whiten, place_rewards,
                         register_advantage_estimator, turn_end_mask, turn_index)
from .losses import (AGGREGATIONS, KL_ESTIMATORS, aggregate, entropy_from_logits, explained_variance, kl_penalty,
                     policy_loss, scored_logprobs_and_entropy, scored_token_logprobs, token_logprobs,
                     token_logprobs_and_entropy, truncated_importance_weights, value_loss)
from .rollout_filter import (FILTER_MODES, FILTER_TYPES, RAGEN_STRATEGIES, TOP_P_MODES, VARIABLE_COUNT_FILTERS,
                             FilterSettings, fixed_kept_groups, num_kept_groups, ragen_selection, select_groups)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "ADVANTAGE_MASKS", "AGGREGATIONS", "AdvantageEstimator", "AdvantageInputs",
    "AdvantageSettings", "FILTER_MODES", "FILTER_TYPES", "FilterSettings", "KL_ESTIMATORS", "ONE_LEARNER",
    "RAGEN_STRATEGIES", "Shards",
    "TOP_P_MODES", "VARIABLE_COUNT_FILTERS", "advantage_recursion_mask", "aggregate",
    "compute_advantages", "compute_batch_advantages",
    "compute_bi_level_gae", "compute_gae", "compute_gigpo_step_advantages", "compute_group_advantages",
    "compute_turn_gae", "entropy_from_logits", "explained_variance", "fixed_kept_groups", "kl_penalty", "masked_whiten",
    "num_kept_groups", "place_rewards", "policy_loss", "ragen_selection", "register_advantage_estimator",
    "scored_logprobs_and_entropy", "scored_token_logprobs", "select_groups",
    "token_logprobs_and_entropy", "token_logprobs", "truncated_importance_weights", "turn_end_mask", "turn_index",
    "value_loss",
]
