"""The multi-turn rollout engine: P groups x N environments played in lockstep by one inference backend.

Every turn, the contexts of all unfinished environments go to the backend in one batch; each reply is parsed,
executed, and its sampled ids appended to that environment's context, followed by the next observation's ids.
The result is one :class:`Trajectory` per environment, exact to the token, plus metrics per environment name.

With a limited context window (``RolloutConfig.context_window``) each turn's prompt is rebuilt instead: the
instructions and the last k turns, from the same token ids (the earlier replies as sampled). Each turn then also
becomes a :class:`TurnSample`, the prompt the policy read and its sampled reply, which the learner trains as a row;
the trajectory's own ``token_ids`` remain the whole conversation, the episode's record.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .. import metrics as M
from ..envs import TRANSITION_SEED, make_text_env
from .backends import InferenceBackend, SamplingParams
from .context import DEFAULT_SYSTEM_PROMPT, ChatFormat, turn_message
from .deadlines import EnvTimeoutError, TimedEnv, call_each
from .protocol import (
    DEFAULT_FORMAT_PENALTY,
    DEFAULT_SEPARATOR,
    REGION_OTHER,
    ParsedReply,
    execute_tool_turn,
    execute_turn,
    parse_reply,
    reply_regions,
)
from .tools import TOOL_HINT, ToolReply, ToolSet, schemas, tool_call_format
from .trajectory import Start, Trajectory, TurnSample, start_env, start_seed

logger = logging.getLogger(__name__)

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


def _turn_seed(sample_seed: int | None, turn: int, wave: int) -> int | None:
    """The backend's sampling seed for one turn of one wave: ``sample_seed * 1000 + turn`` in the first wave (as when
    every episode plays at once), a seed drawn from all three in later waves."""
    if sample_seed is None:
        return None
    if wave == 0:
        return sample_seed * 1000 + turn
    return int(np.random.SeedSequence([sample_seed, turn, wave]).generate_state(1, np.uint64)[0] >> 2)


class _Episode:
    """Mutable per-environment state while a rollout runs."""

    def __init__(self, env, trajectory: Trajectory, prompt_ids: list[int]):
        self.env, self.trajectory = env, trajectory
        trajectory.token_ids.extend(prompt_ids)
        trajectory.response_mask.extend([0] * len(prompt_ids))
        trajectory.behaviour_logprobs.extend([0.0] * len(prompt_ids))
        trajectory.token_regions.extend([REGION_OTHER] * len(prompt_ids))
        self.actions_left = 0
        self.state_key = ""  # of the state the next reply answers
        self.max_turns = 0
        self.done = False
        self.failed = False  # the environment raised; the trajectory is dropped
        # A limited context window rebuilds each prompt from these: the instructions, each turn's user message,
        # and the ids between one reply's start and the next reply (the reply as sampled, then the next message).
        self.instructions = ""
        self.messages: list[str] = []
        self.exchanges: list[list[int]] = []
        self.prompt_ids: list[int] = []  # what the next reply reads
        self.raw_reply = False  # the environment reads each whole reply itself (TextEnv.raw_replies)
        self.tools: ToolSet | None = None  # the environment's tools: the episode is played in tool mode
        self.chat: ChatFormat | None = None  # the chat format of its conversation (its tools, if any)

    def append(self, ids: list[int], logprobs: list[float] | None = None, regions: list[int] | None = None) -> None:
        t = self.trajectory
        t.token_ids.extend(ids)
        t.response_mask.extend([1 if logprobs is not None else 0] * len(ids))
        t.behaviour_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        t.token_regions.extend(regions if regions is not None else [REGION_OTHER] * len(ids))


class RolloutEngine:
    """Plays groups of environments with a backend and returns token-exact trajectories.

    Args:
        config: the agent loop's limits and the environment.
        backend: any :class:`InferenceBackend`.
        tokenizer: the policy's tokenizer (its chat template is checked append-only here).
    """

    def __init__(self, config: RolloutConfig, backend: InferenceBackend, tokenizer):
        self.config, self.backend, self.tokenizer = config, backend, tokenizer
        self.chat = ChatFormat(tokenizer, config.system_prompt)
        # By the tools' JSON: one chat format (checked append-only) and one schema checker per tool set.
        self._tool_modes: dict[str, tuple[ChatFormat, ToolSet]] = {}
        # Kept free after every reply: the longest text that can close it (a reply cut short lacks its eos).
        self.reply_reserve = len(self.chat.encode(self.chat.close))
        self._token_texts: dict[int, str] = {}
        self._named = {name: (env, dict(env_config)) for name, env, env_config in config.environments}
        self._envs: dict[str | None, list] = defaultdict(list)  # built environments, by name (None: config.env)
        # The texts the tokenizer reads as control tokens, longest first (one may contain another).
        specials = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
        self._control_texts = sorted((specials | set(tokenizer.all_special_tokens)) - {""}, key=len, reverse=True)
        # No token spells more characters than its vocabulary entry has (byte-level entries are a byte a character),
        # so a text longer than max_context_tokens such tokens cannot fit; 4x leaves room for normalisers that
        # shorten text. Such a text is never tokenized (a tool's 50 MB answer would take minutes).
        longest = max(map(len, tokenizer.get_vocab()), default=1)
        self._max_text_chars = 4 * config.max_context_tokens * max(longest, 1)
        self._first_failure: str | None = None

    def _env_pool(self, name: str | None, size: int, env_config: dict | None = None) -> list:
        """``size`` environments of the one named ``name`` (None: ``config.env``, built with ``env_config`` when
        given instead of ``config.env_config``: a curriculum stage's), built once and reused."""
        if name is not None and name not in self._named:
            raise KeyError(f"no environment named {name!r} in this rollout's environments {sorted(self._named)}.")
        env, config = (self.config.env, self.config.env_config) if name is None else self._named[name]
        key = name
        if env_config is not None:
            config, key = env_config, (name, json.dumps(env_config, sort_keys=True, default=repr))
            for past in [k for k in self._envs if isinstance(k, tuple) and k != key]:
                del self._envs[past]  # a past stage's environments: no later rollout plays them
        pool = self._envs[key]
        pool[:] = [e for e in pool if not e.stuck]  # one that timed out may still be running its call
        while len(pool) < size:
            pool.append(
                TimedEnv(make_text_env(env, **config), self.config.env_reset_timeout_s, self.config.env_step_timeout_s)
            )
        return pool[:size]

    def _pools(self, starts: Sequence[Start], group_size: int, env_config: dict | None = None) -> list:
        """One environment per episode of ``starts``' groups, each from the pool of its start's environment
        (``env_config``, when given, builds ``config.env``'s)."""
        needed = Counter(start_env(start) for start in starts)
        pools = {
            name: iter(self._env_pool(name, count * group_size, env_config if name is None else None))
            for name, count in needed.items()
        }
        return [next(pools[start_env(start)]) for start in starts for _ in range(group_size)]

    def _reset_options(self, seed: int, member: int) -> dict | None:
        """Reset options of episode ``member`` of a group started from ``seed``: its own luck, when asked for."""
        if self.config.independent_transitions and member > 0:
            return {TRANSITION_SEED: (int(seed), member)}
        return None

    def _plain(self, text: str, counts: Counter) -> str:
        """Environment text as the policy may read it: UTF-8 encodable (``_encodable``), and with no control token.

        The tokenizer turns a special token's text, such as ``<|im_start|>``, into the control token itself, so an
        observation could open a new chat turn or end one. Each such text gets a space after its first character,
        which the tokenizer reads as ordinary characters, and is counted (``rollout/control_texts_neutralised``).
        """
        text = _encodable(text, counts)
        for control in self._control_texts:
            if control in text:
                counts[M.CONTROL_TEXTS] += text.count(control)
                text = text.replace(control, control[:1] + " " + control[1:])
        return text

    def _user_message(
        self, observation: str, turn: int, actions_left: int, reward: float | None, raw_reply: bool
    ) -> str:
        c = self.config
        return turn_message(
            observation,
            turn=turn,
            actions_left=actions_left,
            reward=reward,
            enable_thinking=c.enable_thinking,
            max_actions_per_turn=c.max_actions_per_turn,
            separator=c.action_separator,
            raw_reply=raw_reply,
        )

    def _token_text(self, token: int) -> str:
        """One token's decoded text, memoised (every sampled token is looked up to find its reply region)."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode([token])
        return text

    def _reply_room(self, prompt_ids: list[int]) -> int:
        """Tokens the next reply may take so that its prompt and the reply, closed, fit ``max_context_tokens``."""
        return self.config.max_context_tokens - len(prompt_ids) - self.reply_reserve

    def _prompt(self, episode: _Episode) -> list[int]:
        """What the episode's next reply reads: the conversation so far, or its window of it."""
        return episode.trajectory.token_ids if self.config.window_turns is None else episode.prompt_ids

    def _window_prompt(self, episode: _Episode) -> list[int]:
        """The instructions and the last ``window_turns`` turns, ending with the generation prompt of the turn
        after the last exchange: the first of them opens the conversation as the first prompt does, and each
        later one is the earlier reply as sampled, then the next user message (the ids the full context holds)."""
        turn = len(episode.messages)  # the turn about to be played, 1-based
        first = max(1, turn - self.config.window_turns + 1)
        ids = self.chat.prompt_ids(episode.instructions + "\n" + episode.messages[first - 1])
        for exchange in episode.exchanges[first - 1 : turn - 1]:
            ids = ids + exchange
        return ids

    def first_prompt_length(self, start: Start) -> int:
        """Tokens of the first prompt for the initial state ``start`` (what the policy reads before turn 1)."""
        env = self._env_pool(start_env(start), 1)[0]
        observation, _ = env.reset(seed=start_seed(start))
        counts: Counter = Counter()
        observation = self._plain(_observation_text(env.unwrapped, observation, "reset"), counts)
        chat, _, first, _ = self._first_message(
            env.unwrapped, observation, self._plain(env.unwrapped.describe(), counts)
        )
        return len(chat.prompt_ids(first))

    def _first_message(
        self, text_env, observation: str, instructions: str
    ) -> tuple[ChatFormat, ToolSet | None, str, str]:
        """The chat format an episode of ``text_env`` is played in, its tools (None: not in tool mode), its first user
        message (the instructions, then the first turn's message or, in tool mode, the task and how to call), and that
        turn message alone."""
        tools = _tools_of(text_env)
        if not tools:
            message = self._user_message(
                observation, 1, self.config.max_actions_per_episode, None, _takes_raw_replies(text_env)
            )
            return self.chat, None, instructions + "\n" + message, message
        if self.config.window_turns is not None:
            raise RolloutSettingError(
                f"{type(text_env).__name__} has tools, and tool episodes are played with the "
                "whole conversation in view: set context_window='full' (not "
                f"{self.config.context_window!r})."
            )
        key = json.dumps(tools, sort_keys=True)
        if key not in self._tool_modes:
            self._tool_modes[key] = (
                ChatFormat(
                    self.tokenizer,
                    self.config.system_prompt,
                    tools=tools,
                    tool_format=tool_call_format(self.config.tool_call_format),
                ),
                ToolSet(tools),
            )
        chat, tool_set = self._tool_modes[key]
        message = "\n".join(part for part in (observation, TOOL_HINT) if part)
        return chat, tool_set, "\n".join(part for part in (instructions, message) if part), message

    def rollout(
        self,
        seeds: Sequence[Start],
        group_size: int,
        sampling: SamplingParams,
        sample_seed: int | None = None,
        env_config: dict | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Play ``len(seeds)`` groups of ``group_size`` environments; group g starts every env from ``seeds[g]``.

        Args:
            seeds: one start per group: a reset seed of ``config.env``, or ``(name, seed)`` for an environment of
                ``config.environments``.
            group_size: environments per group (N rollouts of the same initial state).
            sampling: sampling parameters for every turn.
            sample_seed: seeds the backend's sampling; with the same seeds the rollout repeats exactly.
            env_config: builds the bare seeds' ``config.env`` with these arguments instead of ``config.env_config``
                (a curriculum stage's, ``StarPOConfig.training_env_config``); the metrics keep its name.
            progress: called after every turn with the episodes ended so far and those played.

        Returns:
            The trajectories (those whose environment raised are dropped) and metrics.
        """
        c = self.config
        t_start, t_generate = time.perf_counter(), 0.0
        counts: Counter = Counter({key: 0 for key in M.ROLLOUT_COUNTERS})
        episodes: list[_Episode] = []
        too_long: list[int] = []  # lengths of first prompts that leave no room for a reply
        members = [(g, j, s) for g, s in enumerate(seeds) for j in range(group_size)]
        envs = self._pools(seeds, group_size, env_config)
        # Every reset at once: environments that hang together cost one deadline (rollout/deadlines.py).
        resets = call_each(
            [self._reset_call(env, start_seed(start), member) for (_, member, start), env in zip(members, envs)]
        )
        self._first_failure = None
        for (group, member, start), env, (reset, value) in zip(members, envs, resets):
            text_env, seed = env.unwrapped, start_seed(start)
            what = f"env reset failed for seed {seed}"
            if not reset:  # an environment's bug must not take the whole rollout down
                self._count_env_failure(value, counts, what)
                continue
            observation, description = value
            if _too_long_to_read(observation, self._max_text_chars) or _too_long_to_read(
                description, self._max_text_chars
            ):
                too_long.append(c.max_context_tokens + 1)  # more than could ever be read: not tokenized
                continue
            try:  # what the environment handed back (its text, tools, flags) is checked here: its fault, isolated
                observation = self._plain(_observation_text(text_env, observation, "reset"), counts)
                instructions = self._plain(_observation_text(text_env, description, "describe"), counts)
                chat, tools, first, message = self._first_message(text_env, observation, instructions)
                raw_reply, state_key = _takes_raw_replies(text_env), _state_key(text_env, observation)
            except (TypeError, ValueError, RecursionError) as error:
                if isinstance(error, RolloutSettingError):
                    raise
                self._count_env_failure(error, counts, what)
                continue
            env_name = start_env(start) or getattr(env.spec, "id", None) or type(text_env).__name__
            trajectory = Trajectory(env_name, group, seed, [], [], [])
            episode = _Episode(env, trajectory, chat.prompt_ids(first))
            episode.chat, episode.tools, episode.raw_reply = chat, tools, raw_reply
            episode.instructions, episode.messages = instructions, [message]
            episode.prompt_ids = list(trajectory.token_ids)
            if self._reply_room(trajectory.token_ids) < 1:
                # Nothing could be sampled: playing it would only feed the learner a prompt with no reply.
                too_long.append(len(trajectory.token_ids))
                continue
            episode.actions_left = c.max_actions_per_episode
            episode.state_key = state_key
            episode.max_turns = min(c.max_turns, getattr(text_env, "max_turns", None) or c.max_turns)
            episodes.append(episode)

        if too_long:
            self._report_prompts_too_long(too_long, played=len(episodes))
            counts[M.PROMPTS_TOO_LONG] += len(too_long)
        for wave, playing in enumerate(self._waves(episodes, group_size)):
            for turn in range(1, c.max_turns + 1):
                active = [e for e in playing if not e.done]
                if not active:
                    break
                t0 = time.perf_counter()
                prompts = [self._prompt(e) for e in active]
                generations = self.backend.generate(
                    prompts,
                    sampling,
                    _turn_seed(sample_seed, turn, wave),
                    max_new_tokens=[self._reply_room(prompt) for prompt in prompts],
                )
                t_generate += time.perf_counter() - t0
                replies = [self._record_reply(episode, generation) for episode, generation in zip(active, generations)]
                # Every episode's actions at once: environments that hang together cost one deadline per step.
                results = call_each([self._turn_call(episode, reply) for episode, reply in zip(active, replies)])
                for episode, generation, result in zip(active, generations, results):
                    self._finish_turn(episode, generation, turn, result, counts)
                if progress is not None:
                    progress(sum(e.done for e in episodes), len(episodes))
            ended = getattr(self.backend, "conversations_ended", None)  # InferenceBackend's optional method
            if ended is not None:
                ended()
        trajectories = [e.trajectory for e in episodes if not e.failed]
        for t in trajectories:
            t.text = self.tokenizer.decode(t.token_ids)
        metrics = rollout_metrics(trajectories, group_size)
        metrics.update({key: float(value) for key, value in counts.items()})
        metrics.update({M.TIME_ROLLOUT: time.perf_counter() - t_start, M.TIME_GENERATE: t_generate})
        if self._first_failure is not None:
            metrics[M.FIRST_ENV_ERROR] = self._first_failure  # text: the cause, should every episode have failed
        return trajectories, metrics

    def _waves(self, episodes: list[_Episode], group_size: int) -> list[list[_Episode]]:
        """The episodes in the waves they are played in, whole groups at a time: all at once, or at most
        ``max_concurrent_episodes`` (at least one group) until every episode of a wave has ended."""
        cap = self.config.max_concurrent_episodes
        if cap is None or len(episodes) <= cap:
            return [episodes]
        groups: dict[int, list[_Episode]] = {}
        for episode in episodes:
            groups.setdefault(episode.trajectory.group, []).append(episode)
        per_wave = max(1, cap // group_size)
        ordered = list(groups.values())
        return [[e for group in ordered[i : i + per_wave] for e in group] for i in range(0, len(ordered), per_wave)]

    def _count_env_failure(self, error: Exception, counts: Counter, what: str) -> None:
        """Log and count an environment call that raised (``rollout/env_errors``) or timed out (``env_timeouts``);
        the rollout's first is kept as text (``metrics.FIRST_ENV_ERROR``)."""
        if self._first_failure is None:
            self._first_failure = f"{what}: {type(error).__name__}: {error}"[:2000]
        if isinstance(error, EnvTimeoutError):
            logger.warning("%s: %s; dropping that trajectory and replacing the environment", what, error)
            counts[M.ENV_TIMEOUTS] += 1
        else:
            logger.error("%s; dropping that trajectory", what, exc_info=error)
            counts[M.ENV_ERRORS] += 1

    def _report_prompts_too_long(self, lengths: list[int], played: int) -> None:
        c = self.config
        message = (
            f"{len(lengths)} first prompt(s) of {c.env} leave no room for a reply under max_context_tokens="
            f"{c.max_context_tokens} (shortest {min(lengths)} tokens, plus {self.reply_reserve} to close a "
            "reply)"
        )
        if not played:
            raise ValueError(
                f"{message}: no episode can be played. Raise max_context_tokens, or shorten the "
                "observation or the system prompt."
            )
        if c.env not in _WARNED_TOO_LONG:
            _WARNED_TOO_LONG.add(c.env)
            logger.warning(
                "%s; those episodes are not played and are counted as %s (warned once per environment).",
                message,
                M.PROMPTS_TOO_LONG,
            )

    def _reset_call(self, env, seed: int, member: int):
        """One episode's reset and instructions, as a call for :func:`call_each`."""

        def reset():
            observation, _ = env.reset(seed=int(seed), options=self._reset_options(seed, member))
            return observation, env.unwrapped.describe()

        return reset

    def _record_reply(self, episode: _Episode, generation) -> ParsedReply | ToolReply:
        """Append a sampled reply to its episode and parse it."""
        c, t = self.config, episode.trajectory
        start = len(t.token_ids)
        regions = reply_regions([self._token_text(token) for token in generation.token_ids])
        episode.append(generation.token_ids, generation.logprobs, regions)
        t.turn_spans.append((start, len(t.token_ids)))
        if c.window_turns is not None:
            t.turn_samples.append(self._turn_sample(episode.prompt_ids, generation, regions))
        t.turn_states.append(episode.state_key)
        text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        if episode.tools is not None:
            return episode.chat.tool_format.parse(text)
        reply = parse_reply(
            text,
            enable_thinking=c.enable_thinking,
            max_actions_per_turn=c.max_actions_per_turn,
            separator=c.action_separator,
        )
        if episode.raw_reply:  # the environment parses the reply itself: it is one action, thinking and all
            return ParsedReply(format_ok=True, thinking=reply.thinking, actions=(text,) if text.strip() else ())
        return reply

    def _turn_call(self, episode: _Episode, reply: ParsedReply | ToolReply):
        """Executing one parsed reply in its episode's environment, as a call for :func:`call_each`."""
        c = self.config
        if episode.tools is not None:
            return lambda: execute_tool_turn(
                episode.env,
                reply,
                episode.tools,
                actions_left=episode.actions_left,
                max_calls=c.max_actions_per_turn,
                format_penalty=c.format_penalty,
            )
        return lambda: execute_turn(
            episode.env,
            reply,
            actions_left=episode.actions_left,
            format_penalty=c.format_penalty,
            ineffective_action_penalty=c.ineffective_action_penalty,
            ungrounded_reasoning_penalty=c.ungrounded_reasoning_penalty,
        )

    def _finish_turn(
        self, episode: _Episode, generation, turn: int, outcome: tuple[bool, Any], counts: Counter
    ) -> None:
        """Record one executed reply. An environment that raised or paid a non-finite reward drops its episode
        (counted)."""
        c, t = self.config, episode.trajectory
        executed, result = outcome
        if not executed:
            self._count_env_failure(result, counts, f"env step failed in {t.env_name} (seed {t.seed})")
            episode.done = episode.failed = True
            return
        if not math.isfinite(result.reward):
            # A NaN return would make RLlib zero the whole gradient and the run look healthy: drop it, say so.
            if t.env_name not in _WARNED_NONFINITE:
                _WARNED_NONFINITE.add(t.env_name)
                logger.warning(
                    "%s paid a non-finite reward (%s); its trajectories are dropped and counted as %s "
                    "(warned once per environment).",
                    t.env_name,
                    result.reward,
                    M.NONFINITE_REWARDS,
                )
            episode.done = episode.failed = True
            counts[M.NONFINITE_REWARDS] += 1
            return
        texts = [content for _, content in result.tool_results] if episode.tools is not None else [result.observation]
        unreadable = any(_too_long_to_read(text, self._max_text_chars) for text in texts)
        try:  # in tool mode the turn's observations are its calls' results, each made plain once
            tool_results = [
                (
                    name,
                    ""
                    if unreadable
                    else self._plain(_observation_text(episode.env.unwrapped, content, "step"), counts),
                )
                for name, content in result.tool_results
            ]
            if episode.tools is None:
                observation = (
                    ""
                    if unreadable
                    else self._plain(_observation_text(episode.env.unwrapped, result.observation, "step"), counts)
                )
            else:
                observation = tool_results[-1][1] if tool_results else ""
            episode.state_key = _state_key(episode.env.unwrapped, observation)
        except (TypeError, ValueError, RecursionError) as error:
            self._count_env_failure(error, counts, f"env step failed in {t.env_name} (seed {t.seed})")
            episode.done = episode.failed = True
            return
        counts[M.TOOL_CALLS] += result.num_valid + result.num_invalid
        counts[M.TOOL_CALL_ERRORS] += result.num_invalid + result.num_tool_errors
        counts[M.MALFORMED_TOOL_CALLS] += result.num_malformed
        counts[M.TOOL_RESULTS_CUT] += result.num_results_cut
        episode.actions_left -= len(result.executed)
        t.turn_rewards.append(result.reward)
        t.turn_actions.append(list(result.executed))
        if episode.tools is not None:
            t.turn_tool_results.append([{"tool": name, "result": content} for name, content in tool_results])
        t.num_actions += len(result.executed)
        t.num_valid += result.num_valid
        t.num_invalid += result.num_invalid
        t.num_effective += result.num_effective
        t.format_errors += int(result.format_error)
        t.reasoning_claims += result.claims_checked
        t.reasoning_claims_true += result.claims_true
        t.success = result.success
        episode.done = (
            result.terminated
            or result.truncated
            or result.final
            or episode.actions_left <= 0
            or turn >= episode.max_turns
        )
        chat = episode.chat
        if unreadable and not episode.done:
            # Longer than max_context_tokens tokens could spell: never tokenized, the episode ends here, truncated.
            counts[M.OBSERVATIONS_TOO_LONG] += 1
            t.truncated = episode.done = True
        if episode.done:
            episode.append(chat.encode(chat.reply_end_text(generation.token_ids)))
            return
        if episode.tools is not None:
            continuation = chat.encode(chat.tool_turn_text(generation.token_ids, tool_results))
        else:
            message = self._user_message(observation, turn + 1, episode.actions_left, result.reward, episode.raw_reply)
            continuation = chat.encode(chat.next_turn_text(generation.token_ids, message))
        if c.window_turns is None:
            next_length = len(t.token_ids) + len(continuation)
        else:
            episode.messages.append(message)
            episode.exchanges.append(list(generation.token_ids) + continuation)
            episode.prompt_ids = self._window_prompt(episode)
            next_length = len(episode.prompt_ids)
        if next_length + self.reply_reserve + 1 > c.max_context_tokens:
            # No room for the next turn: end here rather than cut the context (which would break append-only).
            t.truncated, episode.done = True, True
            episode.append(chat.encode(chat.reply_end_text(generation.token_ids)))
            return
        episode.append(continuation)

    def _turn_sample(self, prompt_ids: list[int], generation, regions: list[int]) -> TurnSample:
        """The learner's row of one turn under a window: its prompt, the sampled reply, the text closing it."""
        reply, close = list(generation.token_ids), self.chat.encode(self.chat.reply_end_text(generation.token_ids))
        start, end = len(prompt_ids), len(prompt_ids) + len(reply)
        return TurnSample(
            token_ids=list(prompt_ids) + reply + close,
            response_mask=[0] * start + [1] * len(reply) + [0] * len(close),
            behaviour_logprobs=[0.0] * start + list(generation.logprobs) + [0.0] * len(close),
            token_regions=[REGION_OTHER] * start + list(regions) + [REGION_OTHER] * len(close),
            reply_span=(start, end),
        )


def _tools_of(text_env) -> list[dict]:
    """The function schemas of an environment's tools (``TextEnv.tools``); empty for one without tools."""
    tools = getattr(text_env, "tools", None) or []
    if not isinstance(tools, (list, tuple)):
        raise TypeError(f"{type(text_env).__name__}.tools is {tools!r}: it must be a list of function schemas.")
    return schemas(tools)


def _takes_raw_replies(text_env) -> bool:
    """Whether an environment reads each whole reply itself (``TextEnv.raw_replies``), checked to be a bool."""
    raw = getattr(text_env, "raw_replies", False)
    if not isinstance(raw, bool):
        raise TypeError(f"{type(text_env).__name__}.raw_replies is {raw!r}: it must be True or False.")
    return raw


_WARNED_NONFINITE: set[str] = set()  # environments already warned about, once per process
_WARNED_TOO_LONG: set = set()


class RolloutSettingError(ValueError):
    """The rollout's settings cannot play an environment (not the environment's fault): raised, never counted."""


def _too_long_to_read(text, max_chars: int) -> bool:
    """Whether ``text`` is a string longer than any context could hold (``RolloutEngine._max_text_chars``)."""
    return isinstance(text, str) and len(text) > max_chars


def _observation_text(text_env, observation, method: str) -> str:
    """The observation, which must be text; a non-string is the environment's bug and is named."""
    if not isinstance(observation, str):
        raise TypeError(
            f"{type(text_env).__name__}.{method}() returned a {type(observation).__name__} observation; "
            "text environments must return str (see rllib_ragen.envs.TextEnv)."
        )
    return observation


def _state_key(text_env, observation: str) -> str:
    """``TextEnv.state_key()``, or the observation for environments without one."""
    key = getattr(text_env, "state_key", None)
    return str(key()) if callable(key) else observation


def _encodable(text: str, counts: Counter) -> str:
    """``text`` with anything UTF-8 cannot encode (a lone surrogate) replaced by "?", counted."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        counts[M.UNENCODABLE_TEXTS] += 1
        return text.encode("utf-8", "replace").decode("utf-8")


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
    return metrics
