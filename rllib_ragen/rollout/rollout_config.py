"""What a rollout may do: the engine's settings (:class:`RolloutConfig`, RAGEN's agent-loop defaults) and the error for
settings that cannot play an environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .context import DEFAULT_SYSTEM_PROMPT
from .protocol import DEFAULT_FORMAT_PENALTY, DEFAULT_SEPARATOR


# What the policy reads before each reply (RAGEN's context_window_mode: full / limited_multi_turn / single_turn).
CONTEXT_WINDOWS = ("full", "last_k_turns", "single_turn")


@dataclass(frozen=True)
class RolloutConfig:
    """What an episode is allowed to do; RAGEN's agent-loop defaults.

    Attributes:
        env: a registered text-env id (or TextEnv subclass); env_config: its constructor arguments.
        environments: further environments by name, ``((name, env, env_config), ...)``: a rollout's group plays
            one of them when its start is ``(name, seed)`` instead of a bare seed (environment mixtures). Their
            trajectories and metrics carry that name.
        max_turns: replies per episode (an environment's own ``TextEnv.max_turns`` may lower it).
        max_actions_per_turn: actions kept from one reply.
        max_actions_per_episode: actions executed per episode, over all turns.
        format_penalty: added to a turn's reward when its reply breaks the protocol.
        ineffective_action_penalty: added to a turn's reward for each executed action that left the state as it
            was (the environment's ``action_is_effective`` is False).
        ungrounded_reasoning_penalty: added to a turn's reward for each action whose effect the turn's reasoning does
            not state truly (environments that check claims about their state only; ``execute_turn``).
        enable_thinking: require ``<think>`` before ``<answer>``.
        max_context_tokens: no trajectory grows longer. Each reply may take only the room left; a trajectory with
            no room for another turn ends there (truncated); an episode whose first prompt leaves no room is not
            played (counted as ``rollout/prompts_too_long``).
        system_prompt: opens every conversation.
        independent_transitions: a group's episodes share the initial state of its seed but draw their later
            chance (payoffs, slips) independently: episode j > 0 of the group resets with the reset option
            ``TRANSITION_SEED = (seed, j)``; episode 0 keeps the seed's own draws. False (RAGEN's): every
            episode of a group repeats the same luck.
        env_reset_timeout_s, env_step_timeout_s: the longest one ``reset()`` or ``step()`` may take. A later one
            drops its episode (counted as ``rollout/env_timeouts``) and its environment is replaced, so a hung
            environment never hangs the run (``rollout/deadlines.py``).
        context_window: ``"full"``: each reply reads the whole conversation so far. ``"last_k_turns"``: the system
            prompt and instructions, then the last ``context_window_turns`` turns (the current one included);
            ``"single_turn"``: the instructions and the current state. With a window, ``max_context_tokens``
            bounds each turn's prompt and reply, not the conversation.
        context_window_turns: k of ``"last_k_turns"``.
        action_separator: what stands between actions in an answer (``protocol.parse_reply``); None: the whole
            answer is one action, passed to the environment as written (an SQL query with ``||`` in it, a sentence).
        tool_call_format: how the policy writes tool calls for an environment with tools (``TextEnv.tools``), a
            name in ``tools.TOOL_CALL_FORMATS`` (``"hermes"``: ``<tool_call>{"name", "arguments"}</tool_call>``).
        max_concurrent_episodes: play at most this many episodes at a time (whole groups, at least one), each wave
            to its end before the next starts; the KV cache holds one wave's conversations, not every one's
            (SmolLM2 validating 256 FrozenLake states at once held about 8 GiB of it). A wave after the first
            samples from seeds of its own. None: every episode at once.
    """

    env: Any = "rllib_ragen/Sokoban-v0"
    env_config: dict = field(default_factory=dict)
    environments: tuple = ()
    max_turns: int = 5
    max_actions_per_turn: int = 5
    max_actions_per_episode: int = 10
    format_penalty: float = DEFAULT_FORMAT_PENALTY
    ineffective_action_penalty: float = 0.0
    ungrounded_reasoning_penalty: float = 0.0
    enable_thinking: bool = True
    max_context_tokens: int = 4096
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    independent_transitions: bool = False
    env_reset_timeout_s: float = 60.0
    env_step_timeout_s: float = 60.0
    context_window: str = "full"
    context_window_turns: int | None = None
    action_separator: str | None = DEFAULT_SEPARATOR
    tool_call_format: str = "hermes"
    max_concurrent_episodes: int | None = None

    @property
    def window_turns(self) -> int | None:
        """Turns in view before each reply, the current one included (None: all of them)."""
        return {"full": None, "single_turn": 1}.get(self.context_window, self.context_window_turns)


class RolloutSettingError(ValueError):
    """The rollout's settings cannot play an environment (not the environment's fault): raised, never counted."""
