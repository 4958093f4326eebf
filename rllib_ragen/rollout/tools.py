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
import regex

# What a reply without tool calls asks of the policy, written into the first message of a tool episode.
TOOL_HINT = "Call the tools as the system message shows, one call per block; a reply without a tool call is final."
# A schema's regular expressions come from whoever wrote the tool (a server, perhaps): each match is bounded in time
# (the ``regex`` package; Python's ``re``, which jsonschema uses, holds the interpreter for as long as it backtracks).
SCHEMA_PATTERN_TIMEOUT_S = 0.05
MAX_NESTING = 64  # a call, its arguments or a schema nested deeper is refused (JSON parsing itself recurses)


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
        return (
            f"\n\nYou can call these tools (JSON schemas):\n<tools>\n{listed}\n</tools>\nTo call one, write "
            f'{self.open_tag}{{"name": "<tool name>", "arguments": {{<arguments>}}}}{self.close_tag}.'
        )

    def response_text(self, content: str) -> str:
        """A tool result as text, for templates that cannot render a ``tool`` message."""
        return f"<tool_response>\n{content}\n</tool_response>"


TOOL_CALL_FORMATS: dict[str, HermesToolCalls] = {"hermes": HermesToolCalls()}


def tool_call_format(name: str):
    """The registered format called ``name``; a clear error naming the known ones otherwise."""
    try:
        return TOOL_CALL_FORMATS[name]
    except KeyError:
        raise ValueError(
            f"tool_call_format={name!r} is not registered; known formats: {sorted(TOOL_CALL_FORMATS)} "
            "(add one to rllib_ragen.rollout.tools.TOOL_CALL_FORMATS)."
        ) from None


def nesting_depth(text: str) -> int:
    """How deep JSON text nests its arrays and objects (brackets outside strings), in one pass: checked before parsing,
    which recurses once per level and raises RecursionError at about a thousand."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def read_call(body: str) -> tuple[ToolCall | None, str]:
    """One call block's JSON as a :class:`ToolCall`, or (None, why it is not one)."""
    if nesting_depth(body) > MAX_NESTING:
        return None, f"the tool call nests deeper than {MAX_NESTING} levels"
    try:
        value = json.loads(body)
    except ValueError as error:
        return None, f"the tool call is not JSON ({error})"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None, 'a tool call must be a JSON object with a "name" string and an "arguments" object'
    arguments = value.get("arguments", {})
    if isinstance(arguments, str) and nesting_depth(arguments) <= MAX_NESTING:  # some models write a JSON string
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
                raise ToolSchemaError(f"A tool must be a function schema with a name; got {tool!r:.200}.")
            name, parameters = function["name"], function.get("parameters") or {"type": "object", "properties": {}}
            try:
                if nesting_depth(json.dumps(parameters)) > MAX_NESTING:
                    raise ToolSchemaError(f"nests deeper than {MAX_NESTING} levels")
                validator = jsonschema.validators.validator_for(parameters)
                validator.check_schema(parameters)
                if _uses(parameters, "patternProperties") and _uses(parameters, "unevaluatedProperties"):
                    raise ToolSchemaError(
                        "patternProperties beside unevaluatedProperties is not taken (jsonschema "
                        "would match its patterns without a time limit)"
                    )
                for pattern in _patterns(parameters):
                    regex.compile(pattern)
            except (
                jsonschema.SchemaError,
                regex.error,
                ToolSchemaError,
                TypeError,
                ValueError,
                RecursionError,
            ) as error:
                message = getattr(error, "message", None) or str(error)
                raise ToolSchemaError(
                    f"the parameters schema of tool {name!r} is not one jsonschema takes: {message:.300}"
                ) from None
            self._functions[name] = _timed_patterns(validator)(parameters)

    @property
    def names(self) -> list[str]:
        return list(self._functions)

    def check(self, call: ToolCall) -> str | None:
        """Why ``call`` cannot run (an unknown tool, arguments the schema refuses), or None when it can."""
        validator = self._functions.get(call.name)
        if validator is None:
            return f"there is no tool {call.name!r}; the tools are {', '.join(self._functions)}"
        if nesting_depth(json.dumps(call.arguments)) > MAX_NESTING:
            return f"the arguments of {call.name!r} nest deeper than {MAX_NESTING} levels"
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(call.arguments))
        except TimeoutError:
            raise ToolSchemaError(
                f"a pattern in the schema of tool {call.name!r} took over "
                f"{SCHEMA_PATTERN_TIMEOUT_S} s to match an argument (a pattern that backtracks "
                "exponentially?); fix the tool's schema."
            ) from None
        except Exception as error:  # noqa: BLE001 - a $ref it cannot resolve, and the like: the schema's fault
            raise ToolSchemaError(
                f"the schema of tool {call.name!r} could not check a call ({type(error).__name__}: {error})"
            ) from None
        if error is not None:
            where = "/".join(map(str, error.absolute_path)) or "arguments"
            return f"the arguments of {call.name!r} do not fit its schema ({where}: {error.message})"
        return None


class ToolSchemaError(ValueError):
    """An environment's tool schema cannot be used: it is not valid JSON Schema, or it cannot check a call in time.
    The rollout engine counts it as the environment's error and drops that episode."""


def _uses(schema: Any, keyword: str) -> bool:
    """Whether ``keyword`` is a key anywhere in ``schema``."""
    if isinstance(schema, Mapping):
        return keyword in schema or any(_uses(value, keyword) for value in schema.values())
    return isinstance(schema, list) and any(_uses(value, keyword) for value in schema)


def _patterns(schema: Any):
    """Every regular expression of ``schema``: ``pattern`` values and ``patternProperties`` keys, at any depth."""
    if isinstance(schema, Mapping):
        if isinstance(schema.get("pattern"), str):
            yield schema["pattern"]
        if isinstance(schema.get("patternProperties"), Mapping):
            yield from schema["patternProperties"]
        for value in schema.values():
            yield from _patterns(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _patterns(value)


def _search(pattern: str, text: str) -> bool:
    """``re.search`` as jsonschema calls it, bounded by ``SCHEMA_PATTERN_TIMEOUT_S`` (past it ``TimeoutError``)."""
    return regex.search(pattern, text, timeout=SCHEMA_PATTERN_TIMEOUT_S) is not None


def _timed_patterns(validator_class):
    """``validator_class`` with its keywords that match regular expressions (``pattern``, ``patternProperties``, and
    ``additionalProperties`` beside it) matching them under a time limit; the same errors otherwise."""
    from jsonschema import ValidationError
    from jsonschema._keywords import additionalProperties

    def pattern(validator, pattern_, instance, schema):
        if validator.is_type(instance, "string") and not _search(pattern_, instance):
            yield ValidationError(f"{instance!r} does not match {pattern_!r}")

    def pattern_properties(validator, patterns, instance, schema):
        if validator.is_type(instance, "object"):
            for pattern_, subschema in patterns.items():
                for key, value in instance.items():
                    if _search(pattern_, key):
                        yield from validator.descend(value, subschema, path=key, schema_path=pattern_)

    def additional_properties(validator, allowed, instance, schema):
        patterns = schema.get("patternProperties") or {}
        if not patterns or not validator.is_type(instance, "object"):
            yield from additionalProperties(validator, allowed, instance, schema)  # matches no pattern
            return
        properties = schema.get("properties", {})
        extras = sorted(
            key
            for key in instance
            if key not in properties and not any(_search(pattern_, key) for pattern_ in patterns)
        )
        if validator.is_type(allowed, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], allowed, path=extra)
        elif not allowed and extras:
            yield ValidationError(
                f"{', '.join(map(repr, extras))} {'does' if len(extras) == 1 else 'do'} not "
                f"match any of the regexes: {', '.join(map(repr, sorted(patterns)))}"
            )

    return jsonschema.validators.extend(
        validator_class,
        {"pattern": pattern, "patternProperties": pattern_properties, "additionalProperties": additional_properties},
    )


def schemas(tools: Any) -> list[dict]:
    """``tools`` as a list of full OpenAI-style schemas (``{"type": "function", "function": {...}}``)."""
    return [dict(tool) if "function" in tool else {"type": "function", "function": dict(tool)} for tool in tools]
