"""Tool calls: how a reply's calls are read in the model family's own format, checked, and answered.

An environment with tools (``TextEnv.tools``: OpenAI-style function schemas, as ``transformers.utils.get_json_schema``
writes them) is played in tool mode: the policy sees the tools through its chat template (``tools=``), calls them in
its family's native format, and each call's result comes back as a ``tool`` message. A reply without a tool call is
the agent's final answer and ends the episode (as in TRL's and verl's tool loops).

Formats live in ``TOOL_CALL_FORMATS``; ``"hermes"`` is the one Qwen2.5, Qwen3 and Hermes models write::

    <tool_call>
    {"name": "search", "arguments": {"name": "Ada"}}
    </tool_call>

Parsing never raises and is linear in the reply: a block that is not closed, not JSON, or not a name and an object of
arguments is *malformed* (the format penalty; answered with an error and counted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import jsonschema

# What a reply without tool calls asks of the policy, written into the first message of a tool episode.
TOOL_HINT = "Call the tools as the system message shows, one call per block; a reply without a tool call is final."


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's name and its arguments."""

    name: str
    arguments: dict

    def as_action(self) -> str:
        """The call as the environment's ``step`` takes it: ``{"name": ..., "arguments": {...}}`` in JSON."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class ToolReply:
    """What a tool-mode reply holds.

    Attributes:
        calls: the well-formed calls, in order.
        malformed: for each malformed block, why it could not be read.
        content: the reply's text outside the call blocks (its reasoning or final answer), stripped.
    """

    calls: tuple[ToolCall, ...] = ()
    malformed: tuple[str, ...] = ()
    content: str = ""

    @property
    def is_final(self) -> bool:
        """No call at all, well-formed or not: the agent's final answer, which ends the episode."""
        return not self.calls and not self.malformed


@dataclass(frozen=True)
class HermesToolCalls:
    """Hermes-style calls: each a JSON object ``{"name", "arguments"}`` between ``<tool_call>`` tags."""

    name: str = "hermes"
    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"

    def parse(self, text: str) -> ToolReply:
        calls, malformed, outside, position = [], [], [], 0
        while True:
            start = text.find(self.open_tag, position)
            if start < 0:
                outside.append(text[position:])
                break
            outside.append(text[position:start])
            body_start = start + len(self.open_tag)
            end = text.find(self.close_tag, body_start)
            if end < 0:
                malformed.append(f"a {self.open_tag} block is not closed with {self.close_tag}")
                break
            call, why = read_call(text[body_start:end])
            if call is None:
                malformed.append(why)
            else:
                calls.append(call)
            position = end + len(self.close_tag)
        return ToolReply(tuple(calls), tuple(malformed), "".join(outside).strip())

    def describe(self, tools: Sequence[Mapping]) -> str:
        """The tool list and the call syntax, for a system message whose template ignores ``tools=``."""
        listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        return (f"\n\nYou can call these tools (JSON schemas):\n<tools>\n{listed}\n</tools>\nTo call one, write "
                f'{self.open_tag}{{"name": "<tool name>", "arguments": {{<arguments>}}}}{self.close_tag}.')

    def response_text(self, content: str) -> str:
        """A tool result as text, for templates that cannot render a ``tool`` message."""
        return f"<tool_response>\n{content}\n</tool_response>"


TOOL_CALL_FORMATS: dict[str, HermesToolCalls] = {"hermes": HermesToolCalls()}


def tool_call_format(name: str):
    """The registered format called ``name``; a clear error naming the known ones otherwise."""
    try:
        return TOOL_CALL_FORMATS[name]
    except KeyError:
        raise ValueError(f"tool_call_format={name!r} is not registered; known formats: {sorted(TOOL_CALL_FORMATS)} "
                         "(add one to rllib_ragen.rollout.tools.TOOL_CALL_FORMATS).") from None


def read_call(body: str) -> tuple[ToolCall | None, str]:
    """One call block's JSON as a :class:`ToolCall`, or (None, why it is not one)."""
    try:
        value = json.loads(body)
    except ValueError as error:
        return None, f"the tool call is not JSON ({error})"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None, 'a tool call must be a JSON object with a "name" string and an "arguments" object'
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return None, f'the "arguments" of a call to {value["name"]!r} must be a JSON object'
    return ToolCall(value["name"], arguments), ""


@dataclass
class ToolSet:
    """An environment's tools by name, checking calls against their schemas.

    Args:
        tools: OpenAI-style function schemas (``{"type": "function", "function": {"name", "description",
            "parameters"}}``) or their inner ``function`` objects.
    """

    tools: Sequence[Mapping]
    _functions: dict = field(init=False, repr=False)

    def __post_init__(self):
        self._functions = {}
        for tool in self.tools:
            function = tool.get("function", tool) if isinstance(tool, Mapping) else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise ValueError(f"A tool must be a function schema with a name; got {tool!r}.")
            parameters = function.get("parameters") or {"type": "object", "properties": {}}
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
            self._functions[function["name"]] = jsonschema.validators.validator_for(parameters)(parameters)

    @property
    def names(self) -> list[str]:
        return list(self._functions)

    def check(self, call: ToolCall) -> str | None:
        """Why ``call`` cannot run (an unknown tool, arguments the schema refuses), or None when it can."""
        validator = self._functions.get(call.name)
        if validator is None:
            return f"there is no tool {call.name!r}; the tools are {', '.join(self._functions)}"
        error = jsonschema.exceptions.best_match(validator.iter_errors(call.arguments))
        if error is not None:
            where = "/".join(map(str, error.absolute_path)) or "arguments"
            return f"the arguments of {call.name!r} do not fit its schema ({where}: {error.message})"
        return None


def schemas(tools: Any) -> list[dict]:
    """``tools`` as a list of full OpenAI-style schemas (``{"type": "function", "function": {...}}``)."""
    return [dict(tool) if "function" in tool else {"type": "function", "function": dict(tool)} for tool in tools]
