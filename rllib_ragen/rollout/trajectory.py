"""What a rollout produces: one :class:`Trajectory` per episode, exact to the token (with its :class:`TurnSample`
rows under a context window), the learner's padded arrays of them, and where each group starts."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np

from .. import metrics as M
from .protocol import reply_sections


@dataclass
class TurnSample:
    """One turn as the policy played it under a limited context window: one learner row.

    Attributes:
        token_ids: the turn's prompt (instructions and the turns in view, ending with the generation prompt), the
            sampled reply, and the text that closes the reply.
        response_mask, behaviour_logprobs, token_regions: as :class:`Trajectory`'s, over ``token_ids``.
        reply_span: [start, end) of the reply in ``token_ids``; the same ids as the trajectory's turn span.
    """

    token_ids: list[int]
    response_mask: list[int]
    behaviour_logprobs: list[float]
    token_regions: list[int]
    reply_span: tuple[int, int]


@dataclass
class Trajectory:
    """One episode, as the learner needs it.

    Attributes:
        token_ids: the whole conversation (prompt, replies, observations), length T.
        response_mask: (T,) 1 exactly on tokens the policy sampled (end-of-turn token included), else 0.
        behaviour_logprobs: (T,) log-prob of each sampled token under the rollout policy, 0 elsewhere.
        turn_spans: per turn, [start, end) of its reply in ``token_ids``.
        turn_rewards: per turn, the env rewards plus any format penalty.
        turn_states: per turn, the key of the state the policy saw before replying (``TextEnv.state_key``).
        token_regions: (T,) the part of its reply each sampled token belongs to (``protocol.REGION_THINK``,
            ``REGION_ANSWER``, else ``REGION_OTHER``, as is every token not sampled).
        turn_actions: per turn, the canonical names of the actions the environment executed (in tool mode, the
            calls that ran, as JSON).
        turn_tool_results: in tool mode, per turn, ``{"tool": name, "result": text}`` for each call the reply made,
            in order (an error for one that could not run; the name is "" for a block that could not be read).
        env_name: the environment's name: its registered id, or its name in ``RolloutConfig.environments``.
        group: index of the group (initial state) within the rollout; seed: that state's reset seed.
        turn_samples: with a limited context window, each turn as the policy read and played it (the learner's
            rows); empty with the full context, where the trajectory itself is the one row.
        seat, policy_id, outcome: in a multi-agent game (``rollout/seats.py``), the seat this trajectory played,
            the policy that played it, and how the game ended for the seat ("win", "draw", "loss"; "unfinished" if
            it was cut short); None in a single-agent episode.
        game: in a multi-agent game, the game's index within its group (every seat of one game shares it).
    """

    env_name: str
    group: int
    seed: int
    token_ids: list[int]
    response_mask: list[int]
    behaviour_logprobs: list[float]
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_states: list[str] = field(default_factory=list)
    token_regions: list[int] = field(default_factory=list)
    turn_actions: list[list[str]] = field(default_factory=list)
    turn_tool_results: list[list[dict]] = field(default_factory=list)
    success: bool = False
    num_actions: int = 0
    num_valid: int = 0
    num_invalid: int = 0
    num_effective: int = 0
    format_errors: int = 0
    reasoning_claims: int = 0
    reasoning_claims_true: int = 0
    truncated: bool = False
    text: str = ""
    turn_samples: list[TurnSample] = field(default_factory=list)
    seat: str | None = None
    policy_id: str | None = None
    outcome: str | None = None
    game: int | None = None

    @property
    def total_return(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    @property
    def rows(self) -> list:
        """What a learner trains on: the turn samples under a context window, else the trajectory itself. Each has
        ``token_ids``, ``response_mask``, ``behaviour_logprobs`` and ``token_regions``."""
        return list(self.turn_samples) if self.turn_samples else [self]

    def turns(self, tokenizer, advantages: Sequence[float] | None = None) -> list[dict]:
        """The episode turn by turn, as the rollout viewer shows it: the observation before each reply, the reply
        with its reasoning and answer, the actions executed (and in tool mode each call's result), the reward, the
        number of tokens the policy read before the reply (``context_tokens``; ``windowed``: its context window's), and
        the reply's tokens with their ``advantages`` (per token of ``token_ids``) where given."""
        turns, previous_end = [], 0
        for turn, (start, end) in enumerate(self.turn_spans):
            ids = self.token_ids[start:end]
            reply = tokenizer.decode(ids, skip_special_tokens=True)
            think, answer = reply_sections(reply)
            turns.append(
                {
                    "observation": tokenizer.decode(self.token_ids[previous_end:start]),
                    "reply": reply,
                    "think": think,
                    "answer": answer,
                    "actions": self.turn_actions[turn] if turn < len(self.turn_actions) else [],
                    "tool_results": self.turn_tool_results[turn] if turn < len(self.turn_tool_results) else [],
                    "reward": self.turn_rewards[turn] if turn < len(self.turn_rewards) else 0.0,
                    "tokens": [tokenizer.decode([i]) for i in ids],
                    "context_tokens": self.turn_samples[turn].reply_span[0] if self.turn_samples else start,
                    "windowed": bool(self.turn_samples),
                    "advantages": [float(a) for a in advantages[start:end]] if advantages is not None else None,
                }
            )
            previous_end = end
        return turns


def pad_trajectories(trajectories: Sequence[Trajectory], pad_token_id: int) -> dict[str, np.ndarray]:
    """Right-pad trajectories into (B, T) arrays, T the longest trajectory.

    Returns:
        ``input_ids`` (int64, ``pad_token_id`` beyond each end), ``attention_mask`` (int64, 1 on real tokens),
        ``response_mask`` (float32, 1 on sampled tokens) and ``behaviour_logprobs`` (float32), zero-padded.
    """
    batch_size, width = len(trajectories), max(len(t.token_ids) for t in trajectories)
    columns = {
        "input_ids": np.full((batch_size, width), pad_token_id, dtype=np.int64),
        "attention_mask": np.zeros((batch_size, width), dtype=np.int64),
        "response_mask": np.zeros((batch_size, width), dtype=np.float32),
        "behaviour_logprobs": np.zeros((batch_size, width), dtype=np.float32),
    }
    for row, t in enumerate(trajectories):
        n = len(t.token_ids)
        columns["input_ids"][row, :n] = t.token_ids
        columns["attention_mask"][row, :n] = 1
        columns["response_mask"][row, :n] = t.response_mask
        columns["behaviour_logprobs"][row, :n] = t.behaviour_logprobs
    return columns


Start = Union[int, tuple[str, int]]  # a group's initial state: a seed of config.env, or (environment name, seed)


def start_env(start: Start) -> str | None:
    """The name of the environment a start plays (None: the rollout's ``config.env``)."""
    return start[0] if isinstance(start, tuple) else None


def start_seed(start: Start) -> int:
    return int(start[1] if isinstance(start, tuple) else start)


@dataclass
class SeedSchedule:
    """Training initial-state seeds, which never repeat: each training rollout takes the next ``num_groups``,
    from ``next_train`` on (``StarPOConfig.train_seed_start``). Validation plays a fixed set:
    ``StarPOConfig.validation_starts``."""

    next_train: int = 10_000

    def train(self, num_groups: int) -> list[int]:
        seeds = list(range(self.next_train, self.next_train + num_groups))
        self.next_train += num_groups
        return seeds

    def get_state(self) -> dict:
        return {"next_train": self.next_train}

    def set_state(self, state: dict) -> None:
        self.next_train = state["next_train"]


def rollout_metrics(trajectories: Sequence[Trajectory], group_size: int) -> dict[str, float]:
    """RAGEN's rollout metrics, per environment name (``{env}/success``, ...) and pooled (``rollout/``),
    plus RLlib's standard episode metrics (an episode's length is its number of turns, its env steps)."""
    by_env: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_env[t.env_name].append(t)
    metrics: dict[str, float] = {
        M.EPISODE_RETURN_MEAN: float(np.mean([t.total_return for t in trajectories])) if trajectories else np.nan,
        M.EPISODE_LEN_MEAN: float(np.mean([t.num_turns for t in trajectories])) if trajectories else np.nan,
        M.NUM_EPISODES: float(len(trajectories)),
        M.NUM_ENV_STEPS_SAMPLED: float(sum(t.num_turns for t in trajectories)),
    }
    for name, group in list(by_env.items()) + [(M.POOLED, list(trajectories))]:
        if not group:
            continue
        turns = max(sum(t.num_turns for t in group), 1)
        pieces = max(sum(t.num_valid + t.num_invalid for t in group), 1)
        actions = max(sum(t.num_actions for t in group), 1)
        groups: dict[int, list[bool]] = defaultdict(list)
        for t in group:
            groups[t.group].append(t.success)
        metrics.update(
            {
                M.env_metric(name, key): value
                for key, value in {
                    M.SUCCESS: float(np.mean([t.success for t in group])),
                    M.PASS_AT.format(group_size=group_size): float(np.mean([any(s) for s in groups.values()])),
                    M.NUM_ACTIONS: float(np.mean([t.num_actions for t in group])),
                    M.NUM_TURNS: float(np.mean([t.num_turns for t in group])),
                    M.VALID_ACTION_RATE: sum(t.num_valid for t in group) / pieces,
                    M.EFFECTIVE_ACTION_RATE: sum(t.num_effective for t in group) / actions,
                    M.FORMAT_ERROR_RATE: sum(t.format_errors for t in group) / turns,
                    M.RESPONSE_TOKENS_PER_TURN: sum(sum(t.response_mask) for t in group) / turns,
                    M.RETURN_MEAN: float(np.mean([t.total_return for t in group])),
                    M.TRUNCATED_RATE: float(np.mean([t.truncated for t in group])),
                    M.NUM_TRAJECTORIES: float(len(group)),
                }.items()
            }
        )
        claims = sum(t.reasoning_claims for t in group)
        if claims:
            metrics[M.env_metric(name, M.REASONING_GROUNDED)] = sum(t.reasoning_claims_true for t in group) / claims
        for seat in sorted({t.seat for t in group if t.seat is not None}):  # a game's seats: how each fared
            outcomes = [t.outcome for t in group if t.seat == seat]
            for outcome in M.GAME_OUTCOMES:
                metrics[M.env_metric(name, f"{seat}/{outcome}_rate")] = outcomes.count(outcome) / len(outcomes)
    return metrics
