"""The agent action protocol: how a model's reply becomes environment actions and a turn reward.

A reply must look like ``<think>...</think><answer>A1 || A2 || ...</answer>`` (the think block is optional
when thinking is off). Parsing never raises: anything off-template is a *format error*, which executes no
action and costs the format penalty. Inside a well-formed answer, a piece that names no environment action is
skipped and also costs the penalty; the remaining pieces still run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import gymnasium as gym

from ..envs.base import checks_reasoning_claims

DEFAULT_SEPARATOR = "||"
DEFAULT_FORMAT_PENALTY = -0.1

# Any think/answer tag, loosely spelled (case, inner spaces): finding one where the template allows none is an
# error. No nested quantifiers: a scan is linear in the text.
_TAG = re.compile(r"</?\s*(?:think|answer)\s*>", re.IGNORECASE)
_WITH_THINK = ("<think>", "</think>", "<answer>", "</answer>")
_ANSWER_ONLY = ("<answer>", "</answer>")


@dataclass(frozen=True)
class ParsedReply:
    """What the protocol read from one reply.

    Attributes:
        format_ok: the reply matches the template exactly (one think block when required, one answer block,
            no nested or repeated tags, nothing but whitespace around them).
        thinking: the think block's text, if any.
        actions: the answer's pieces, stripped, empty ones dropped, at most ``max_actions_per_turn``; empty
            when ``format_ok`` is False.
        num_dropped: well-formed pieces cut off by ``max_actions_per_turn``.
    """

    format_ok: bool
    thinking: str | None = None
    actions: tuple[str, ...] = ()
    num_dropped: int = 0


def parse_reply(
    text: str,
    *,
    enable_thinking: bool = True,
    max_actions_per_turn: int | None = 5,
    separator: str | None = DEFAULT_SEPARATOR,
) -> ParsedReply:
    """Parse a model reply into action strings. Never raises; linear in the length of ``text``.

    The reply's tags, in order, must be exactly ``<think> </think> <answer> </answer>`` (or ``<answer> </answer>``
    when thinking is off), spelled that way in any case, with nothing but whitespace before, between and after
    the two blocks.

    Args:
        text: the decoded reply (special tokens removed).
        enable_thinking: require a ``<think>`` block before the answer.
        max_actions_per_turn: pieces kept from the answer (None: all); the rest are dropped (and counted).
        separator: the string between actions inside the answer (None or "": the answer is one action).
    """
    if not isinstance(text, str):
        return ParsedReply(format_ok=False)
    # Five tags are enough to tell: any well-formed reply has two or four.
    tags = [match for match, _ in zip(_TAG.finditer(text), range(5))]
    spelled = tuple(match.group().lower() for match in tags)
    if spelled == _WITH_THINK:
        open_think, close_think, open_answer, close_answer = tags
        thinking = text[open_think.end() : close_think.start()]
        between = text[close_think.end() : open_answer.start()]
    elif spelled == _ANSWER_ONLY and not enable_thinking:
        open_answer, close_answer = tags
        thinking, between = None, ""
    else:
        return ParsedReply(format_ok=False)
    outside = (text[: tags[0].start()], between, text[close_answer.end() :])
    if any(part.strip() for part in outside):
        return ParsedReply(format_ok=False)
    answer = text[open_answer.end() : close_answer.start()]
    # map/filter run in C: a megabyte of actions must not take a Python loop per piece.
    pieces = list(filter(None, map(str.strip, answer.split(separator) if separator else [answer])))
    kept = tuple(pieces if max_actions_per_turn is None else pieces[: max(max_actions_per_turn, 0)])
    return ParsedReply(True, thinking, kept, len(pieces) - len(kept))


# What part of a reply a sampled token belongs to (``reply_regions``); StarPOConfig.loss_mask trains some of them.
REGION_OTHER, REGION_THINK, REGION_ANSWER = 0, 1, 2
LOSS_MASK_REGIONS = {
    "all": (REGION_OTHER, REGION_THINK, REGION_ANSWER),  # every sampled token (RAGEN's)
    "no_think": (REGION_OTHER, REGION_ANSWER),  # all but the reasoning inside <think>...</think>
    "answer": (REGION_ANSWER,),  # the <answer>...</answer> block alone, tags included
}


def _section_spans(text: str) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """Character spans of the first ``<think>`` block's text (tags excluded; an unclosed block runs to the end) and
    of the first ``<answer>...</answer>`` after it (tags included), or None where absent."""
    think = answer = None
    think_open = text.find("<think>")
    if think_open >= 0:
        start = think_open + len("<think>")
        close = text.find("</think>", start)
        think = (start, close if close >= 0 else len(text))
    answer_open = text.find("<answer>", think[1] if think else 0)
    if answer_open >= 0:
        close = text.find("</answer>", answer_open)
        answer = (answer_open, close + len("</answer>") if close >= 0 else len(text))
    return think, answer


def reply_sections(text: str) -> tuple[str, str]:
    """The reasoning and the answer of a reply's text, as ``reply_regions`` delimits them, cut from the text
    itself (a token that straddles a tag, which no region claims, keeps its characters here); "" where absent."""
    think, answer = _section_spans(text)
    return (text[think[0] : think[1]] if think else "", text[answer[0] : answer[1]] if answer else "")


def reply_regions(token_texts: list[str]) -> list[int]:
    """Each reply token's region: ``REGION_THINK`` for a token wholly inside the text of the first
    ``<think>...</think>`` (an unclosed block runs to the end), ``REGION_ANSWER`` for a token touching the first
    ``<answer>...</answer>`` after it, tags included, else ``REGION_OTHER`` (the think tags, whitespace, the
    end-of-turn token). Tags are matched as the template writes them; linear in the reply's length.

    Args:
        token_texts: the decoded text of each token of the reply, in order.
    """
    think, answer = _section_spans("".join(token_texts))
    regions, position = [], 0
    for piece in token_texts:
        end = position + len(piece)
        if think and think[0] <= position < end <= think[1]:
            regions.append(REGION_THINK)
        elif answer and position < answer[1] and end > answer[0]:
            regions.append(REGION_ANSWER)
        else:
            regions.append(REGION_OTHER)
        position = end
    return regions


@dataclass
class TurnResult:
    """The outcome of executing one parsed reply in an environment.

    Attributes:
        reward: environment rewards of the executed actions plus the format penalty when it applies, the
            ineffective-action penalty for each executed action that did not change the state, and the
            ungrounded-reasoning penalty for each action whose effect the reasoning did not state truly.
        env_reward: the environment rewards alone.
        executed: canonical names of the actions that ran, in order.
        num_valid, num_invalid: answer pieces that did / did not name an environment action.
        num_effective: executed actions that changed the state.
        format_error: the penalty applied (off-template reply, an invalid piece, or no valid action).
        terminated, truncated: the environment's episode end signals after the last executed action.
        success: the environment's ``success`` after the turn.
        observation: the state text after the turn.
        claims_checked, claims_true: the claims about the state the reasoning made that the environment can check
            (``TextEnv.reasoning_claims``, against the state the reply was written for), and how many hold.
        tool_results: in tool mode, ``(tool name, result text)`` for each call read from the reply, in order, an
            error message for each that could not run.
        num_tool_errors: calls that ran but whose tool failed (the step's info says ``tool_error``).
        num_results_cut: calls whose result the environment cut to its size limit (info ``tool_result_cut``).
        num_malformed: call blocks that could not be read.
        final: in tool mode, the reply made no call: it is the agent's final answer and ends the episode.
    """

    reward: float
    env_reward: float
    observation: str
    executed: list[str] = field(default_factory=list)
    num_valid: int = 0
    num_invalid: int = 0
    num_effective: int = 0
    format_error: bool = False
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    claims_checked: int = 0
    claims_true: int = 0
    tool_results: list[tuple[str, str]] = field(default_factory=list)
    num_tool_errors: int = 0
    num_results_cut: int = 0
    num_malformed: int = 0
    final: bool = False


def execute_turn(
    env: gym.Env,
    reply: ParsedReply,
    *,
    actions_left: int,
    format_penalty: float = DEFAULT_FORMAT_PENALTY,
    ineffective_action_penalty: float = 0.0,
    ungrounded_reasoning_penalty: float = 0.0,
) -> TurnResult:
    """Run a reply's valid actions in order until the episode ends or ``actions_left`` is spent.

    Args:
        env: a (possibly wrapped) :class:`~rllib_ragen.envs.TextEnv`; actions go through the wrappers.
        reply: the parsed reply.
        actions_left: the episode's remaining action budget.
        format_penalty: added once to the turn reward on a format error (a negative number).
        ineffective_action_penalty: added to the turn reward once per executed action whose step info says
            ``action_is_effective`` is False (a negative number, or 0 to leave such moves unpenalised).
        ungrounded_reasoning_penalty: added to the turn reward once per action of the environment whose effect the
            reasoning does not state truly, wrongly or not at all (a negative number, or 0). Only environments that
            check claims (``checks_reasoning_claims``) are charged: all true costs 0, no reasoning the most.
    """
    text_env = env.unwrapped
    # Checked against the state the reply was written for, before its actions change it.
    claims_checked, claims_true = reasoning_claims(text_env, reply.thinking)
    valid = [action for action in map(text_env.canonical_action, reply.actions) if action is not None]
    result = TurnResult(
        reward=0.0,
        env_reward=0.0,
        observation=text_env.observation,
        num_valid=len(valid),
        num_invalid=len(reply.actions) - len(valid),
        success=text_env.success,
        claims_checked=claims_checked,
        claims_true=claims_true,
    )
    result.format_error = not reply.format_ok or result.num_invalid > 0 or not valid
    for name in valid[: max(actions_left, 0)]:
        obs, reward, terminated, truncated, info = env.step(name)
        result.env_reward += reward
        result.executed.append(name)
        result.num_effective += bool(info.get("action_is_effective", False))
        result.observation, result.terminated, result.truncated = obs, terminated, truncated
        result.success = bool(info.get("success", False))
        if terminated or truncated:
            break
    num_ineffective = len(result.executed) - result.num_effective
    ungrounded = 0
    if ungrounded_reasoning_penalty and checks_reasoning_claims(text_env):
        ungrounded = len(text_env.action_names) - claims_true
        if ungrounded < 0:
            raise ValueError(
                f"{type(text_env).__name__}.reasoning_claims() found {claims_true} true claims among "
                f"{len(text_env.action_names)} actions: ungrounded_reasoning_penalty needs at most one "
                "counted claim per action."
            )
    result.reward = (
        result.env_reward
        + (format_penalty if result.format_error else 0.0)
        + ineffective_action_penalty * num_ineffective
        + ungrounded_reasoning_penalty * ungrounded
    )
    return result


def execute_tool_turn(
    env: gym.Env,
    reply,
    tools,
    *,
    actions_left: int,
    max_calls: int | None,
    format_penalty: float = DEFAULT_FORMAT_PENALTY,
) -> TurnResult:
    """Run a tool-mode reply's calls in order (``rollout/tools.py``); each call that runs is one action.

    A call to an unknown tool, with arguments its schema refuses, past ``max_calls`` or past the episode's action
    budget runs nothing and is answered with an error (``num_invalid``); a block that could not be read is answered
    likewise (``num_malformed``). Either costs the format penalty once; the episode goes on. Calls after one that ended
    the episode are not run. A reply without any call is final (``TurnResult.final``).

    Args:
        env: a (possibly wrapped) text environment with tools; a call reaches its ``step`` as
            ``ToolCall.as_action()``, and the observation ``step`` returns is the call's result.
        reply: the parsed :class:`~rllib_ragen.rollout.tools.ToolReply`.
        tools: the environment's :class:`~rllib_ragen.rollout.tools.ToolSet`, which checks each call.
        actions_left: the episode's remaining action budget.
        max_calls: calls run per reply (None: all).
        format_penalty: added once to the turn reward when a call was malformed or could not run.
    """
    text_env = env.unwrapped
    result = TurnResult(
        reward=0.0,
        env_reward=0.0,
        observation=text_env.observation,
        success=text_env.success,
        final=reply.is_final,
        num_malformed=len(reply.malformed),
    )
    result.tool_results = [("", f"Error: {why}.") for why in reply.malformed]
    for index, call in enumerate(reply.calls):
        if result.terminated or result.truncated:
            break
        error = tools.check(call)
        if max_calls is not None and index >= max_calls:
            error = f"at most {max_calls} tool calls run per reply; this one did not"
        elif len(result.executed) >= actions_left:
            error = "the episode has no tool calls left; this one did not run"
        if error is not None:
            result.num_invalid += 1
            result.tool_results.append((call.name, f"Error: {error}."))
            continue
        action = call.as_action()
        observation, reward, terminated, truncated, info = env.step(action)
        result.num_valid += 1
        result.env_reward += reward
        result.executed.append(action)
        result.num_effective += bool(info.get("action_is_effective", True))
        result.num_tool_errors += bool(info.get("tool_error", False))
        result.num_results_cut += bool(info.get("tool_result_cut", False))
        result.tool_results.append((call.name, observation))
        result.observation, result.terminated, result.truncated = observation, terminated, truncated
        result.success = bool(info.get("success", False))
    result.format_error = bool(reply.malformed) or result.num_invalid > 0
    result.reward = result.env_reward + (format_penalty if result.format_error else 0.0)
    return result


def reasoning_claims(text_env, reasoning: str | None) -> tuple[int, int]:
    """``TextEnv.reasoning_claims(reasoning)``; (0, 0) without reasoning or for environments without the method."""
    check = getattr(text_env, "reasoning_claims", None)
    if not reasoning or not callable(check):
        return 0, 0
    checked, true = check(reasoning)
    if not 0 <= true <= checked:
        raise ValueError(
            f"{type(text_env).__name__}.reasoning_claims() returned {(checked, true)}: it must be "
            "(checked, true) with 0 <= true <= checked."
        )
    return int(checked), int(true)
