"""Separate policies for a game's seats, the RLlib way: ``config.multi_agent(policies=..., policy_mapping_fn=...,
policies_to_train=...)``.

Self-play plays every seat with one policy (RLlib's ``default_policy``), its role in its prompt. With separate
policies the policy ``policy_mapping_fn(seat, None)`` names plays a seat (called with the seat alone: a text game
has no RLlib episode object), each policy its own ``CausalLMRLModule`` in the learner's ``MultiRLModule`` and its own
sampler in every env runner, all starting from the same model. Each policy of ``policies_to_train`` (None: all) is
trained on its own seats' trajectories, with its own rollout filter, advantages, echo-trap probe and sentinel rules;
the others are played and never trained (no batch of theirs reaches the learner). What is the policy's alone is
logged under ``policies/<id>/`` (the driver's measures) and ``learners/<id>/`` (the learner's), as RLlib logs a
module's.
"""

from __future__ import annotations

from typing import Sequence

from ray.rllib.core import DEFAULT_MODULE_ID

from .. import metrics as M
from ..rollout.trajectory import Trajectory
from ..sentinel import as_rule
from .update_batch import prepare_update_batch


class ConfigPolicies:
    """:class:`~rllib_ragen.starpo.config.StarPOConfig`'s reading of RLlib's multi-agent settings."""

    @property
    def separate_policies(self) -> bool:
        """Whether ``multi_agent(policies=...)`` names policies other than the one of self-play."""
        return set(self.policies) != {DEFAULT_MODULE_ID}

    def policy_ids(self) -> list[str]:
        return sorted(self.policies)

    def trained_policy_ids(self) -> list[str]:
        """The policies an update trains: ``policies_to_train``, or every policy when it is None."""
        return sorted(self.policies if self.policies_to_train is None else self.policies_to_train)

    def seat_policy(self, seat: str) -> str:
        """The policy that plays ``seat``."""
        return str(self.policy_mapping_fn(seat, None)) if self.separate_policies else DEFAULT_MODULE_ID


def separate_policy_errors(config):
    """What separate policies need (``config_rules``)."""
    if not config.separate_policies:
        return
    policies = config.policy_ids()
    named = f"multi_agent(policies={policies})"
    if not config.self_play:
        yield f"{named}: separate policies play a game's seats; set self_play=True with a built-in game as env."
        return
    if config.league_interval:
        yield (
            f"league_interval={config.league_interval}: the league freezes self-play's one policy; with {named} set "
            "league_interval=0."
        )
    # Each policy has its own Hugging Face sampler, and one learner trains them all, on the rollout just played.
    if config.inference_backend != "hf":
        yield f"inference_backend={config.inference_backend!r}: {named} needs inference_backend='hf'."
    if config.max_policy_lag:
        yield f"max_policy_lag={config.max_policy_lag}: {named} trains on-policy; set max_policy_lag=0."
    if config.num_learners > 1:
        yield f"num_learners={config.num_learners}: {named} trains on one learner; set num_learners to 0 or 1."
    if callable(config.policies_to_train):
        yield f"policies_to_train: with {named} give the list of trained policy ids, not a function."
        return
    trained = config.trained_policy_ids()
    unknown = sorted(set(trained) - set(policies))
    if unknown or not trained:
        yield f"policies_to_train={config.policies_to_train}: name at least one of {policies} and nothing else."
    from ..envs.games import GAMES, make_game

    if config.env not in GAMES:
        return  # _self_play_errors names the game it needs
    seats = make_game(config.env, config=dict(config.env_config.get("game_config") or {})).possible_agents
    played = set()
    for seat in seats:
        try:
            policy = config.seat_policy(seat)
        except Exception as error:  # the user's function
            yield f"policy_mapping_fn({seat!r}, None) raised {error!r}: it is called with a seat of {config.env} alone."
            continue
        if policy not in policies:
            yield f"policy_mapping_fn({seat!r}, None) returned {policy!r}, which is not one of {policies}."
        played.add(policy)
    idle = sorted(set(policies) - played)
    if idle:
        yield f"{named}: {idle} play no seat of {config.env} (seats {list(seats)}); map a seat to each, or drop them."
    signals = [as_rule(rule).signal for rule in config.sentinel_rules]
    stale = [
        signal
        for signal in signals
        if _logged_per_policy(signal) or (DEFAULT_MODULE_ID not in policies and f"/{DEFAULT_MODULE_ID}/" in signal)
    ]
    if stale:
        yield (
            f"sentinel_rules watch {stale}, which {named} logs per policy only; watch policies/<policy>/... and "
            "learners/<policy>/... (rllib_ragen.sentinel.echo_trap_rules(action, policies=...) writes them per policy)."
        )


# What the driver measures on a policy's own batch (the rollout filter, the update's rows, the probe): with separate
# policies these are logged under each policy's name only. The replies' diagnostics stay pooled as well.
_PROBE_METRICS = (M.RETRIEVAL_ACCURACY, M.MI_ESTIMATE, M.CROSS_SCORE_MARGIN, "collapse/grad_norm_", "collapse/groups_")


def _logged_per_policy(signal: str) -> bool:
    return signal != M.FILTER_EMPTY_STEPS and signal.startswith(("rollout_filter/", "update/", *_PROBE_METRICS))


def policy_batches(
    trajectories: Sequence[Trajectory], config, pad_token_id: int, **prepare
) -> tuple[dict[str, tuple[dict, list[int]]], dict[str, float]]:
    """Each trained policy's update batch from one rollout (``prepare_update_batch``, ``prepare`` its keyword
    arguments): policy id -> (its columns, the indices in ``trajectories`` its rows' ``trajectory`` column counts
    from); a policy whose filter kept nothing has none. With one policy its metrics are the rollout's; with separate
    policies each policy's are under ``metrics.policy_metric``."""
    if not config.separate_policies:
        columns, metrics = prepare_update_batch(trajectories, config, pad_token_id, **prepare)
        batches = {} if columns is None else {DEFAULT_MODULE_ID: (columns, list(range(len(trajectories))))}
        return batches, metrics
    batches, metrics = {}, {}
    for policy in config.trained_policy_ids():
        indices = [i for i, t in enumerate(trajectories) if t.policy_id == policy]
        if not indices:  # every game of its seats failed: counted in the rollout's metrics
            continue
        columns, part = prepare_update_batch([trajectories[i] for i in indices], config, pad_token_id, **prepare)
        metrics.update({M.policy_metric(policy, key): value for key, value in part.items()})
        if columns is not None:
            batches[policy] = (columns, indices)
    return batches, metrics
