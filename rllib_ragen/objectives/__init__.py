"""StarPO's math as pure torch functions on padded tensors: advantages, the rollout filter, losses. No Ray."""

from .advantages import (compute_batch_advantages, compute_gae, compute_group_advantages, place_rewards)
from .losses import (AGGREGATIONS, KL_ESTIMATORS, aggregate, entropy_from_logits, explained_variance, kl_penalty,
                     policy_loss, value_loss)
from .rollout_filter import FILTER_MODES, select_groups

__all__ = [
    "AGGREGATIONS", "FILTER_MODES", "KL_ESTIMATORS", "aggregate", "compute_batch_advantages", "compute_gae",
    "compute_group_advantages", "entropy_from_logits", "explained_variance", "kl_penalty", "place_rewards",
    "policy_loss", "select_groups", "value_loss",
]
