"""The advantage estimators by name: ``ADVANTAGE_ESTIMATORS`` maps each name
``StarPOConfig.training(advantage_estimator=...)`` accepts to an :class:`AdvantageEstimator`: one function with one
signature, ``fn(inputs, settings) -> (advantages, returns)``, and whether it needs the critic. Every estimator runs
on the learner, once per update, on the kept batch (see ``rllib_ragen/starpo/batch_advantages.py``); with
data-parallel learners each holds whole groups, and :class:`Shards` gives an estimator what spans them. Add your own
with :func:`register_advantage_estimator`. The math: ``advantages.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .advantages import (
    compute_batch_advantages,
    compute_bi_level_gae,
    compute_gae,
    compute_gigpo_step_advantages,
    compute_group_advantages,
    compute_turn_gae,
    masked_whiten,
    turn_index,
    turn_values_on_tokens,
)


# ---- what spans data-parallel learners -------------------------------------------------------------------------------
def _this_learner_only(x: torch.Tensor) -> torch.Tensor:
    return x


def _this_learners_rows(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return values, torch.arange(len(values), device=values.device)


@dataclass(frozen=True)
class Shards:
    """What an estimator reads across data-parallel learners, each of which holds whole groups of the batch.

    The defaults are one learner's: the batch is all there is.

    Attributes:
        sum: a tensor summed over the learners (an all-reduce).
        gather: ``(values (n,), group_ids (n,))`` of this learner's trajectories -> every learner's values in the
            whole batch's order (group order, as the batch is built), and the positions of this learner's own in it.
    """

    sum: Callable[[torch.Tensor], torch.Tensor] = _this_learner_only
    gather: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = _this_learners_rows


ONE_LEARNER = Shards()


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read; every tensor is zero off ``response_mask``.

    Attributes:
        token_rewards: (B, T) rewards on response tokens (see :func:`place_rewards`).
        response_mask: (B, T) 1 on tokens the policy sampled.
        returns: (B,) each trajectory's return (the sum of its turn rewards).
        group_ids: (B,) the group (shared initial state) of each trajectory.
        values: (B, T) the critic's values, or None for an estimator without a critic.
        turn_rewards, turn_states: per trajectory, each turn's reward and the key of the state it saw (any
            hashable: the learner passes integer ids, equal where the keys were).
        baselines: (B,) each trajectory's role baseline (``rae``: :class:`~.role_baselines.RoleBaselines`), or None.
        shards: the other learners' part of the batch (:class:`Shards`; default: none).
    """

    token_rewards: torch.Tensor
    response_mask: torch.Tensor
    returns: torch.Tensor
    group_ids: torch.Tensor
    values: torch.Tensor | None = None
    turn_rewards: list[list[float]] | None = None
    turn_states: list[list] | None = None
    baselines: torch.Tensor | None = None
    shards: Shards = ONE_LEARNER


@dataclass(frozen=True)
class AdvantageSettings:
    """The estimator knobs of ``StarPOConfig`` (see its ``training()`` docstring for each).

    Attributes:
        gamma, lam: ``gae``'s discount and lambda (``gamma``, ``lambda_``); ``lam`` serves every GAE-family one.
        normalize_std: divide by the std for ``grpo``, ``brpo`` and GiGPO's two parts (``grpo_normalize_std``).
        gamma_turn, gamma_token: ``bi_level_gae``'s discounts across and inside turns; ``turn_gae`` uses
            ``gamma_turn``.
        step_gamma, omega: GiGPO's step-return discount and the weight of its step-level advantage.
        whiten: whiten the advantages of estimators with a critic over the batch's generated tokens.
    """

    gamma: float = 1.0
    lam: float = 1.0
    normalize_std: bool = True
    gamma_turn: float = 0.95
    gamma_token: float = 1.0
    step_gamma: float = 0.95
    omega: float = 1.0
    whiten: bool = True


EstimatorFn = Callable[[AdvantageInputs, AdvantageSettings], "tuple[torch.Tensor, torch.Tensor | None]"]


@dataclass(frozen=True)
class AdvantageEstimator:
    """An entry of ``ADVANTAGE_ESTIMATORS``.

    Attributes:
        fn: ``fn(inputs, settings) -> (advantages (B, T), returns (B, T) or None)``; the returns are the
            critic's targets and are needed only when ``needs_critic``.
        needs_critic: True builds a critic, whose values the estimator reads in ``inputs.values``.
    """

    fn: EstimatorFn
    needs_critic: bool


def _outcome(per_trajectory: torch.Tensor, inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """One advantage per trajectory (B,), given to each of its response tokens (B, T)."""
    mask = inputs.response_mask.float()
    return per_trajectory[:, None].float() * mask, None


def _gae(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_gae(inputs.token_rewards, inputs.values, inputs.response_mask, settings.gamma, settings.lam)


def _bi_level_gae(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_bi_level_gae(
        inputs.token_rewards,
        inputs.values,
        inputs.response_mask,
        settings.gamma_turn,
        settings.gamma_token,
        settings.lam,
    )


def _turn_gae(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_turn_gae(
        inputs.token_rewards, inputs.values, inputs.response_mask, settings.gamma_turn, settings.lam
    )


def _gigpo(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, None]:
    if inputs.turn_rewards is None or inputs.turn_states is None:
        raise ValueError(
            "gigpo needs each trajectory's turn rewards and state keys (AdvantageInputs.turn_rewards, "
            ".turn_states); StarPO's learner passes them from the batch's columns."
        )
    episode, _ = _grpo(inputs, settings)
    steps = compute_gigpo_step_advantages(
        inputs.turn_rewards, inputs.turn_states, inputs.group_ids, settings.step_gamma, settings.normalize_std
    )
    index = turn_index(inputs.response_mask)
    turns = [len(s) for s in steps]
    if (index.max(-1).values + 1).tolist() != turns:
        raise ValueError(
            f"gigpo: the response mask holds {(index.max(-1).values + 1).tolist()} turns per trajectory "
            f"but the turn rewards {turns}; every turn must be one contiguous run of sampled tokens."
        )
    per_turn = torch.zeros(len(steps), max(turns, default=0), device=index.device)
    for i, values in enumerate(steps):
        per_turn[i, : len(values)] = torch.tensor(values)
    return episode + settings.omega * turn_values_on_tokens(per_turn, index), None


def _grpo(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, None]:
    return _outcome(compute_group_advantages(inputs.returns, inputs.group_ids, settings.normalize_std), inputs)


def _brpo(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, None]:
    # The baseline spans every learner's trajectories, in the whole batch's order: several learners compute, bit for
    # bit, what one learner would.
    everyone, mine = inputs.shards.gather(inputs.returns, inputs.group_ids)
    return _outcome(compute_batch_advantages(everyone, settings.normalize_std)[mine], inputs)


def _raw(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, None]:
    return _outcome(inputs.returns, inputs)


def _rae(inputs: AdvantageInputs, settings: AdvantageSettings) -> tuple[torch.Tensor, None]:
    if inputs.baselines is None:
        raise ValueError(
            "rae needs each trajectory's role baseline (AdvantageInputs.baselines); StarPO's driver puts it in the "
            "batch's role_baseline column (objectives/role_baselines.py)."
        )
    return _outcome(inputs.returns - inputs.baselines.to(inputs.returns), inputs)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "gae": AdvantageEstimator(_gae, needs_critic=True),  # PPO with a critic: StarPO-S
    "bi_level_gae": AdvantageEstimator(_bi_level_gae, needs_critic=True),  # TRICO: across turns, then inside each
    "turn_gae": AdvantageEstimator(_turn_gae, needs_critic=True),  # one GAE advantage per turn
    "gigpo": AdvantageEstimator(_gigpo, needs_critic=False),  # GRPO + omega x anchor-state step advantage
    "grpo": AdvantageEstimator(_grpo, needs_critic=False),  # the return against its group's
    "brpo": AdvantageEstimator(_brpo, needs_critic=False),  # the return against the whole batch's
    "raw": AdvantageEstimator(_raw, needs_critic=False),  # the return itself
    "rae": AdvantageEstimator(_rae, needs_critic=False),  # the return against its role's running mean (SPIRAL)
}


BUILT_IN_ESTIMATORS = frozenset(ADVANTAGE_ESTIMATORS)


def register_advantage_estimator(name: str, fn: EstimatorFn, *, needs_critic: bool = False) -> None:
    """Make ``advantage_estimator=name`` select ``fn``.

    Register in a module every process imports (the driver, remote env runners and learners), as you would a
    gymnasium environment: estimators run on the learners. One that reads the whole batch (not only each group)
    reads the other learners' part through ``inputs.shards``.

    Args:
        name: the new name; the built-in ones cannot be replaced.
        fn: ``fn(inputs: AdvantageInputs, settings: AdvantageSettings) -> (advantages, returns or None)``.
        needs_critic: whether ``fn`` reads ``inputs.values`` (and returns the critic's targets).
    """
    if name in BUILT_IN_ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is built in; register yours under another name.")
    ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(fn, needs_critic)


def compute_advantages(
    name: str, inputs: AdvantageInputs, settings: AdvantageSettings, whiten_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the estimator registered as ``name``; (advantages (B, T), returns (B, T) or None).

    The advantages of an estimator with a critic are whitened over ``whiten_mask`` (default: the estimator's own
    ``inputs.response_mask``; the learner passes the generated tokens) when ``settings.whiten`` (RAGEN's
    default), with the statistics of every learner's part (``inputs.shards``); the returns, the critic's targets,
    never are.
    """
    if name not in ADVANTAGE_ESTIMATORS:
        raise KeyError(f"advantage estimator {name!r}: choose one of {sorted(ADVANTAGE_ESTIMATORS)}.")
    estimator = ADVANTAGE_ESTIMATORS[name]
    if estimator.needs_critic and inputs.values is None:
        raise ValueError(f"advantage estimator {name!r} needs the critic's values; it runs on the learner.")
    advantages, returns = estimator.fn(inputs, settings)
    if estimator.needs_critic and settings.whiten:
        advantages = masked_whiten(
            advantages, inputs.response_mask if whiten_mask is None else whiten_mask, sum_over_shards=inputs.shards.sum
        )
    return advantages, returns
