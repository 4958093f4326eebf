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
from typing import Any, Callable, Sequence

import numpy as np

from .. import metrics as M
from ..envs import TRANSITION_SEED, make_text_env
from .backends import InferenceBackend, SamplingParams
from .context import ChatFormat, turn_message
from .episode_state import EpisodeState
from .env_text import TextGuard, episode_state_key, observation_text, report_prompts_too_long, takes_raw_replies
from .env_text import tools_of
from .deadlines import EnvTimeoutError, TimedEnv, call_each
from .protocol import REGION_OTHER, ParsedReply, execute_tool_turn, execute_turn, parse_reply, reply_regions
from .rollout_config import RolloutConfig, RolloutSettingError
from .tools import TOOL_HINT, ToolReply, ToolSet, tool_call_format
from .trajectory import Start, Trajectory, TurnSample, rollout_metrics, start_env, start_seed

logger = logging.getLogger(__name__)


def _turn_seed(sample_seed: int | None, turn: int, wave: int) -> int | None:
    """The backend's sampling seed for one turn of one wave: ``sample_seed * 1000 + turn`` in the first wave (as when
    every episode plays at once), a seed drawn from all three in later waves."""
    if sample_seed is None:
        return None
    if wave == 0:
        return sample_seed * 1000 + turn
    return int(np.random.SeedSequence([sample_seed, turn, wave]).generate_state(1, np.uint64)[0] >> 2)


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
        self.text_guard = TextGuard(tokenizer, config.max_context_tokens)
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

    def _prompt(self, episode: EpisodeState) -> list[int]:
        """What the episode's next reply reads: the conversation so far, or its window of it."""
        return episode.trajectory.token_ids if self.config.window_turns is None else episode.prompt_ids

    def _window_prompt(self, episode: EpisodeState) -> list[int]:
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
        observation = self.text_guard.plain(observation_text(env.unwrapped, observation, "reset"), counts)
        chat, _, first, _ = self._first_message(
            env.unwrapped, observation, self.text_guard.plain(env.unwrapped.describe(), counts)
        )
        return len(chat.prompt_ids(first))

    def _first_message(
        self, text_env, observation: str, instructions: str
    ) -> tuple[ChatFormat, ToolSet | None, str, str]:
        """The chat format an episode of ``text_env`` is played in, its tools (None: not in tool mode), its first user
        message (the instructions, then the first turn's message or, in tool mode, the task and how to call), and that
        turn message alone."""
        tools = tools_of(text_env)
        if not tools:
            message = self._user_message(
                observation, 1, self.config.max_actions_per_episode, None, takes_raw_replies(text_env)
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
        episodes: list[EpisodeState] = []
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
            if self.text_guard.too_long(observation) or self.text_guard.too_long(description):
                too_long.append(c.max_context_tokens + 1)  # more than could ever be read: not tokenized
                continue
            try:  # what the environment handed back (its text, tools, flags) is checked here: its fault, isolated
                observation = self.text_guard.plain(observation_text(text_env, observation, "reset"), counts)
                instructions = self.text_guard.plain(observation_text(text_env, description, "describe"), counts)
                chat, tools, first, message = self._first_message(text_env, observation, instructions)
                raw_reply, state_key = takes_raw_replies(text_env), episode_state_key(text_env, observation)
            except (TypeError, ValueError, RecursionError) as error:
                if isinstance(error, RolloutSettingError):
                    raise
                self._count_env_failure(error, counts, what)
                continue
            env_name = start_env(start) or getattr(env.spec, "id", None) or type(text_env).__name__
            trajectory = Trajectory(env_name, group, seed, [], [], [])
            episode = EpisodeState(env, trajectory, chat.prompt_ids(first))
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
            report_prompts_too_long(c.env, c.max_context_tokens, self.reply_reserve, too_long, len(episodes))
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
                counts[M.ACTIONS_DROPPED] += sum(getattr(reply, "num_dropped", 0) for reply in replies)
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

    def _waves(self, episodes: list[EpisodeState], group_size: int) -> list[list[EpisodeState]]:
        """The episodes in the waves they are played in, whole groups at a time: all at once, or at most
        ``max_concurrent_episodes`` (at least one group) until every episode of a wave has ended."""
        cap = self.config.max_concurrent_episodes
        if cap is None or len(episodes) <= cap:
            return [episodes]
        groups: dict[int, list[EpisodeState]] = {}
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

    def _reset_call(self, env, seed: int, member: int):
        """One episode's reset and instructions, as a call for :func:`call_each`."""

        def reset():
            observation, _ = env.reset(seed=int(seed), options=self._reset_options(seed, member))
            return observation, env.unwrapped.describe()

        return reset

    def _record_reply(self, episode: EpisodeState, generation) -> ParsedReply | ToolReply:
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

    def _turn_call(self, episode: EpisodeState, reply: ParsedReply | ToolReply):
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
        self, episode: EpisodeState, generation, turn: int, outcome: tuple[bool, Any], counts: Counter
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
        unreadable = any(self.text_guard.too_long(text) for text in texts)
        try:  # in tool mode the turn's observations are its calls' results, each made plain once
            tool_results = [
                (
                    name,
                    ""
                    if unreadable
                    else self.text_guard.plain(observation_text(episode.env.unwrapped, content, "step"), counts),
                )
                for name, content in result.tool_results
            ]
            if episode.tools is None:
                observation = (
                    ""
                    if unreadable
                    else self.text_guard.plain(
                        observation_text(episode.env.unwrapped, result.observation, "step"), counts
                    )
                )
            else:
                observation = tool_results[-1][1] if tool_results else ""
            episode.state_key = episode_state_key(episode.env.unwrapped, observation)
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


_WARNED_NONFINITE: set[str] = set()  # environments already warned about, once per process
