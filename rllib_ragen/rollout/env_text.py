"""What the rollout engine reads from an environment besides its step: its tools, whether it reads whole replies,
its observation as text, its state key; each checked, a wrong type named as the environment's bug. And the text
guard: environment text as the policy may read it (encodable, no control token, not too long to tokenize)."""

from __future__ import annotations

import logging
from collections import Counter

from .. import metrics as M
from .tools import schemas

logger = logging.getLogger(__name__)
_WARNED_TOO_LONG: set = set()  # environments warned about, once per process


def tools_of(text_env) -> list[dict]:
    """The function schemas of an environment's tools (``TextEnv.tools``); empty for one without tools."""
    tools = getattr(text_env, "tools", None) or []
    if not isinstance(tools, (list, tuple)):
        raise TypeError(f"{type(text_env).__name__}.tools is {tools!r}: it must be a list of function schemas.")
    return schemas(tools)


def takes_raw_replies(text_env) -> bool:
    """Whether an environment reads each whole reply itself (``TextEnv.raw_replies``), checked to be a bool."""
    raw = getattr(text_env, "raw_replies", False)
    if not isinstance(raw, bool):
        raise TypeError(f"{type(text_env).__name__}.raw_replies is {raw!r}: it must be True or False.")
    return raw


def observation_text(text_env, observation, method: str) -> str:
    """The observation, which must be text; a non-string is the environment's bug and is named."""
    if not isinstance(observation, str):
        raise TypeError(
            f"{type(text_env).__name__}.{method}() returned a {type(observation).__name__} observation; "
            "text environments must return str (see rllib_ragen.envs.TextEnv)."
        )
    return observation


def episode_state_key(text_env, observation: str) -> str:
    """``TextEnv.state_key()``, or the observation for environments without one."""
    key = getattr(text_env, "state_key", None)
    return str(key()) if callable(key) else observation


def encodable(text: str, counts: Counter) -> str:
    """``text`` with anything UTF-8 cannot encode (a lone surrogate) replaced by "?", counted."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        counts[M.UNENCODABLE_TEXTS] += 1
        return text.encode("utf-8", "replace").decode("utf-8")


class TextGuard:
    """Environment text as a policy with ``tokenizer`` and a context of ``max_context_tokens`` may read it."""

    def __init__(self, tokenizer, max_context_tokens: int):
        # The texts the tokenizer reads as control tokens, longest first (one may contain another).
        specials = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
        self.control_texts = sorted((specials | set(tokenizer.all_special_tokens)) - {""}, key=len, reverse=True)
        # No token spells more characters than its vocabulary entry has (byte-level entries are a byte a character),
        # so a text longer than max_context_tokens such tokens cannot fit; 4x leaves room for normalisers that
        # shorten text. Such a text is never tokenized (a tool's 50 MB answer would take minutes).
        longest = max(map(len, tokenizer.get_vocab()), default=1)
        self.max_chars = 4 * max_context_tokens * max(longest, 1)

    def too_long(self, text) -> bool:
        """Whether ``text`` is a string longer than any context could hold."""
        return isinstance(text, str) and len(text) > self.max_chars

    def plain(self, text: str, counts: Counter) -> str:
        """UTF-8 encodable (:func:`encodable`), and with no control token.

        The tokenizer turns a special token's text, such as ``<|im_start|>``, into the control token itself, so an
        observation could open a new chat turn or end one. Each such text gets a space after its first character,
        which the tokenizer reads as ordinary characters, and is counted (``rollout/control_texts_neutralised``).
        """
        text = encodable(text, counts)
        for control in self.control_texts:
            if control in text:
                counts[M.CONTROL_TEXTS] += text.count(control)
                text = text.replace(control, control[:1] + " " + control[1:])
        return text


def report_prompts_too_long(env, max_context_tokens: int, reply_reserve: int, lengths: list[int], played: int) -> None:
    """Raise if no first prompt of ``env`` leaves room for a reply (``lengths``: those that do not); else warn, once
    per environment and process."""
    message = (
        f"{len(lengths)} first prompt(s) of {env} leave no room for a reply under max_context_tokens="
        f"{max_context_tokens} (shortest {min(lengths)} tokens, plus {reply_reserve} to close a "
        "reply)"
    )
    if not played:
        raise ValueError(
            f"{message}: no episode can be played. Raise max_context_tokens, or shorten the "
            "observation or the system prompt."
        )
    if env not in _WARNED_TOO_LONG:
        _WARNED_TOO_LONG.add(env)
        logger.warning(
            "%s; those episodes are not played and are counted as %s (warned once per environment).",
            message,
            M.PROMPTS_TOO_LONG,
        )
