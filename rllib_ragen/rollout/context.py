"""Token-level context: the messages an agent sees and the exact token ids they become.

A trajectory's token ids are built once and only ever appended to: the first prompt is rendered with the
tokenizer's chat template, each reply is appended as the *sampled* ids, and each new observation is appended as
the tokenization of the text the chat template would add for it. Earlier turns are never decoded and
re-encoded, so the learner scores exactly the ids the policy sampled.

The per-turn text comes from diffing small renders of the template. That is only right when the template
renders a conversation append-only; :class:`ChatFormat` checks this at start-up with a multi-turn conversation
and refuses templates that rewrite earlier turns (for example ones that strip earlier ``<think>`` blocks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_SYSTEM_PROMPT = "You are an agent playing a text game. Think step by step, then answer with your actions."
_REPLY = "@@REPLY@@"
_USER = "@@USER@@"


RAW_REPLY_HINT = "Your whole reply goes to the environment as written: follow its instructions."


def format_hint(
    enable_thinking: bool, max_actions_per_turn: int, separator: str | None = "||", raw_reply: bool = False
) -> str:
    """The one-line reminder of the answer format that ends every observation message. ``separator``: what stands
    between actions in the answer (None: the answer is one action, whatever it holds). ``raw_reply``: the
    environment reads the whole reply itself (``TextEnv.raw_replies``), in the format its instructions give."""
    if raw_reply:
        return RAW_REPLY_HINT
    answer = f"<answer>action {separator} action</answer>" if separator else "<answer>action</answer>"
    template = f"<think>your reasoning</think>{answer}" if enable_thinking else answer
    if not separator:
        return f"Reply exactly as {template}: the answer is one action."
    return f"Reply exactly as {template} with at most {max_actions_per_turn} actions."


def turn_message(
    observation: str,
    *,
    turn: int,
    actions_left: int,
    reward: float | None = None,
    enable_thinking: bool = True,
    max_actions_per_turn: int = 5,
    separator: str | None = "||",
    raw_reply: bool = False,
) -> str:
    """The user message of one turn: last reward (after the first turn), state, action budget and format."""
    reward_line = "" if reward is None else f"Reward: {reward:g}\n"
    return (
        f"{reward_line}Turn {turn}. State:\n{observation}\nYou have {actions_left} actions left. "
        f"{format_hint(enable_thinking, max_actions_per_turn, separator, raw_reply)}"
    )


# What turn_message writes, read back: the parser and the writer above change together.
_TURN_MESSAGE = re.compile(
    r"(?:Reward: (?P<reward>\S+)\n)?Turn (?P<turn>\d+)\. State:\n(?P<observation>.*?)\n"
    r"You have (?P<actions_left>\d+) actions left\. ",
    re.DOTALL,
)


@dataclass(frozen=True)
class TurnMessage:
    """The parts of a :func:`turn_message`."""

    observation: str
    turn: int
    actions_left: int
    reward: float | None


def last_turn_message(text: str) -> TurnMessage:
    """The last :func:`turn_message` in ``text`` (a conversation, or one message).

    Raises:
        ValueError: no turn message in ``text``.
    """
    match = None
    for match in _TURN_MESSAGE.finditer(text):
        pass
    if match is None:
        raise ValueError("No 'Turn N. State: ... You have N actions left.' message in the text.")
    reward = match.group("reward")
    return TurnMessage(
        match.group("observation"),
        int(match.group("turn")),
        int(match.group("actions_left")),
        None if reward is None else float(reward),
    )


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be used append-only."""


class ChatFormat:
    """Turns messages into token ids append-only, using the tokenizer's own chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        system_prompt: the system message opening every conversation (None for templates without one).
        tools: function schemas of an environment played in tool mode (``rollout/tools.py``), given to the template
            as ``tools=``. A template that ignores them gets them in the system message instead, in
            ``tool_format``'s words, and a template that cannot render a ``tool`` message gets each result as a user
            turn (``tool_format.response_text``).
        tool_format: the tool-call format the policy writes (``tools.TOOL_CALL_FORMATS``).

    Raises:
        TemplateError: the template is missing or not append-only; the message says which check failed.
    """

    def __init__(self, tokenizer, system_prompt: str | None = DEFAULT_SYSTEM_PROMPT, tools=None, tool_format=None):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"{type(tokenizer).__name__} has no chat_template; set tokenizer.chat_template.")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tools = list(tools) if tools else None
        self.tool_format = tool_format
        self._template_tools = None  # what the template is given as tools= (None: no tools, or it ignores them)
        self.tools_in_template = self.tool_turns_in_template = False
        if self.tools:
            self._template_tools = self.tools
            plain = self._render(self._messages(_USER), generation_prompt=True, tools=None)
            self.tools_in_template = self._render(self._messages(_USER), generation_prompt=True) != plain
            if not self.tools_in_template:  # the documented fallback: the tool list in the system message
                self._template_tools = None
                prefix = (system_prompt or "").rstrip()
                self.system_prompt = (prefix + tool_format.describe(self.tools)).lstrip()
        base = self._messages(_USER)
        prompt = self._render(base, generation_prompt=True)
        with_reply = self._render(base + [{"role": "assistant", "content": _REPLY}], generation_prompt=False)
        if not with_reply.startswith(prompt + _REPLY):
            raise TemplateError(
                "The chat template does not place a reply right after the generation prompt, so "
                "sampled tokens cannot be appended as they are."
            )
        # After a reply: `close` ends the assistant turn; `user_prefix` + message + `user_suffix` opens the next
        # user turn and the generation prompt.
        self.close = with_reply[len(prompt + _REPLY) :]
        after = self._render(
            base + [{"role": "assistant", "content": _REPLY}, {"role": "user", "content": _USER}],
            generation_prompt=True,
        )
        if not after.startswith(with_reply):
            raise TemplateError("Adding a user turn changes the rendering of the turns before it.")
        self.user_prefix, _, self.user_suffix = after[len(with_reply) :].partition(_USER)
        self._with_reply_base = (base, with_reply)
        self.eos_token_id = tokenizer.eos_token_id
        self._eos_text = tokenizer.eos_token or ""
        if self.tools:
            self.tool_turns_in_template = self._renders_tool_turns()
        self._check_append_only()

    # ---- rendering --------------------------------------------------------------------------------------
    def _messages(self, first_user: str) -> list[dict]:
        system = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        return system + [{"role": "user", "content": first_user}]

    def _render(self, messages: list[dict], generation_prompt: bool, tools="template") -> str:
        tools = self._template_tools if tools == "template" else tools
        extra = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **extra
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # ---- the three pieces of a trajectory ---------------------------------------------------------------
    def prompt_text(self, first_user: str) -> str:
        return self._render(self._messages(first_user), generation_prompt=True)

    def prompt_ids(self, first_user: str) -> list[int]:
        """System and first user message, ending with the generation prompt."""
        return self.encode(self.prompt_text(first_user))

    def reply_end_text(self, reply_ids: list[int]) -> str:
        """Template text that must follow a reply to close the assistant turn.

        When the policy already sampled its end-of-turn token, only what the template puts after it remains.
        """
        if reply_ids and reply_ids[-1] == self.eos_token_id and self.close.startswith(self._eos_text):
            return self.close[len(self._eos_text) :]
        return self.close

    def next_turn_text(self, reply_ids: list[int], user_message: str) -> str:
        """Everything between a reply and the next reply: close the turn, the user message, generation prompt."""
        return self.reply_end_text(reply_ids) + self.user_prefix + user_message + self.user_suffix

    def tool_turn_text(self, reply_ids: list[int], results: list[tuple[str, str]]) -> str:
        """Everything between a reply with tool calls and the next reply: close the turn, one ``tool`` message per
        ``(tool name, result)`` as the template renders them (or user turns where it cannot), generation prompt."""
        if not self.tool_turns_in_template:
            message = "\n".join(self.tool_format.response_text(content) for _, content in results)
            return self.next_turn_text(reply_ids, message)
        base, with_reply = self._with_reply_base
        messages = base + [{"role": "assistant", "content": _REPLY}] + _tool_messages(results)
        after = self._render(messages, generation_prompt=True)
        if not after.startswith(with_reply):
            raise TemplateError("Adding tool messages changes the rendering of the turns before them.")
        return self.reply_end_text(reply_ids) + after[len(with_reply) :]

    # ---- start-up checks --------------------------------------------------------------------------------
    def _renders_tool_turns(self) -> bool:
        """Whether the template renders a ``tool`` message's content after a reply, append-only."""
        base, with_reply = self._with_reply_base
        try:
            after = self._render(
                base + [{"role": "assistant", "content": _REPLY}] + _tool_messages([("probe", _USER)]),
                generation_prompt=True,
            )
        except Exception:  # a template that refuses the role (raise_exception): results go as user turns
            return False
        return after.startswith(with_reply) and _USER in after[len(with_reply) :]

    def _check_append_only(self) -> None:
        users = ["Turn 1. State:\nP_O", "Reward: -0.1\nTurn 2. State:\n_PO", "Reward: 10\nTurn 3. State:\n__S"]
        replies = [
            "<think>Move right twice.</think><answer>Right || Right</answer>",
            "<think>One more.</think><answer>Right</answer>",
        ]
        messages = self._messages(users[0])
        incremental = self.prompt_text(users[0])
        for reply, user in zip(replies, users[1:]):
            incremental += reply + self.next_turn_text([], user)
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": user}]
        self._compare(self._render(messages, generation_prompt=True), incremental, "multi-turn conversations")
        if not self.tools:
            return
        name = self.tools[0]["function"]["name"]
        call = f'{self.tool_format.open_tag}\n{{"name": "{name}", "arguments": {{}}}}\n{self.tool_format.close_tag}'
        results = [[(name, "first result")], [(name, "second result"), (name, "third result")]]
        messages = self._messages(users[0])
        incremental = self.prompt_text(users[0])
        for result in results:
            incremental += call + self.tool_turn_text([], result)
            messages += [{"role": "assistant", "content": call}]
            messages += (
                _tool_messages(result)
                if self.tool_turns_in_template
                else [{"role": "user", "content": "\n".join(self.tool_format.response_text(c) for _, c in result)}]
            )
        self._compare(self._render(messages, generation_prompt=True), incremental, "tool calls and their results")

    def _compare(self, full: str, incremental: str, what: str) -> None:
        if full != incremental:
            cut = next(
                (i for i, (a, b) in enumerate(zip(full, incremental)) if a != b), min(len(full), len(incremental))
            )
            raise TemplateError(
                f"The chat template does not render {what} append-only (it rewrites earlier turns, "
                f"e.g. strips <think> blocks); first difference at character {cut}: {full[cut : cut + 60]!r} vs "
                f"{incremental[cut : cut + 60]!r}. Use a template that keeps earlier turns verbatim "
                "(set tokenizer.chat_template)."
            )


def _tool_messages(results: list[tuple[str, str]]) -> list[dict]:
    return [{"role": "tool", "name": name, "content": content} for name, content in results]
