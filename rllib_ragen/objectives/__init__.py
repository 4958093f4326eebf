"""StarPO's math as pure torch functions on padded tensors: advantages, the rollout filter, losses. No Ray."""

from .advantages import (ADVANTAGE_ESTIMATORS, AdvantageEstimator, AdvantageInputs, AdvantageSettings,
                         compute_advantages, compute_batch_advantages, compute_gae, compute_group_advantages,
                         place_rewards, register_advantage_estimator)
from .losses import (AGGREGATIONS, KL_ESTIMATORS, aggregate, entropy_from_logits, explained_variance, kl_penalty,
                     policy_loss, token_logprobs, token_logprobs_and_entropy, value_loss)
from .rollout_filter import FILTER_MODES, num_kept_groups, select_groups

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "AdvantageEstimator", "AdvantageInputs", "AdvantageSettings",
    "FILTER_MODES", "KL_ESTIMATORS", "aggregate", "compute_advantages", "compute_batch_advantages", "compute_gae",
    "compute_group_advantages", "entropy_from_logits", "explained_variance", "kl_penalty", "num_kept_groups",
    "place_rewards", "policy_loss", "register_advantage_estimator", "select_groups", "token_logprobs_and_entropy",
    "token_logprobs", "value_loss",
]
