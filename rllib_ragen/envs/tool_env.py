"""Text environments whose actions are tool calls, and environments written to TRL's ``environment_factory`` contract.

:class:`ToolTextEnv` turns methods into tools: a subclass names them in ``tool_names``; each takes JSON-able keyword
arguments, has type hints and a Google-style docstring (its schema comes from ``transformers.utils.get_json_schema``,
as TRL's and transformers' tool use read them), and returns its result as text. The rollout engine plays such an
environment in tool mode (``rllib_ragen/rollout/tools.py``): each call reaches ``step`` as
``{"name": ..., "arguments": {...}}`` in JSON, and ``step`` answers with the tool's result.

:class:`TRLEnvironment` plays any class written for TRL's ``GRPOTrainer(environment_factory=...)`` unchanged: built
with no arguments, ``reset(**task)`` at the start of an episode (its string, if any, follows the task's prompt), its
public methods as tools, and ``get_reward()`` as the environment's reward.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import numbers
from typing import Any, Callable, ClassVar, Mapping, Sequence

from .base import TextEnv, load_import_path


def method_schema(method: Callable) -> dict:
    """A method's tool schema, from its type hints and Google docstring (``transformers.utils.get_json_schema``)."""
    from transformers.utils import get_json_schema

    schema = get_json_schema(method)
    schema["function"].pop("return", None)  # what a tool returns is text to the policy; the schema is for its call
    return schema


class ToolTextEnv(TextEnv):
    """A text environment whose actions are calls of its tool methods.

    Subclasses name their tools in ``tool_names`` and implement ``_reset_state()`` and ``_render_text()`` (the task
    as the agent first reads it). A tool returns its result as text; it pays a reward with ``self._pay(reward)`` and
    ends the episode with ``self._end_episode(success)``. A tool that raises is answered with the error's message and
    counted (``rollout/tool_call_errors``), as TRL answers it; the episode goes on. A result longer than
    ``max_observation_chars`` is cut to it, saying so at its end, and counted (``rollout/tool_results_cut``), as the
    MCP client caps what a server sends.
    """

    tool_names: ClassVar[Sequence[str]] = ()

    def __init__(self, render_mode: str | None = "ansi", max_observation_chars: int = 4096):
        super().__init__(render_mode, max_observation_chars)
        self.max_observation_chars = max_observation_chars
        self._tools: list[dict] | None = None
        self._turn_reward, self._terminated = 0.0, False
        self.calls: list[str] = []  # this episode's calls, as step took them

    def tool_functions(self) -> dict[str, Callable]:
        """The tools by name (bound methods)."""
        return {name: getattr(self, name) for name in self.tool_names}

    @property
    def tools(self) -> list[dict]:
        if self._tools is None:
            self._tools = [method_schema(function) for function in self.tool_functions().values()]
        return self._tools

    def describe(self) -> str:
        """The instructions; the tools reach the policy through the chat template, not this text."""
        return self.instructions.strip()

    def state_key(self) -> str:
        """The task and the calls made so far: turns that answer the same task after the same calls are one state."""
        return "\n".join([self._render_text(), *self.calls])

    def _pay(self, reward: float) -> None:
        self._turn_reward += float(reward)

    def _end_episode(self, success: bool) -> None:
        self._terminated, self._success = True, bool(success)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self.calls = []
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self._turn_reward, self._terminated = 0.0, False
        try:
            call = json.loads(action)
            function = self.tool_functions()[call["name"]]
            arguments = dict(call.get("arguments") or {})
        except (ValueError, TypeError, KeyError):
            info = {"success": self._success, "action_is_valid": False, "action_is_effective": False}
            return f"Error: {action!r} is not a call of a tool of this environment.", 0.0, False, False, info
        self.calls.append(action)
        failed = False
        try:
            result = function(**arguments)
            if inspect.isawaitable(result):  # an async tool (TRL takes them too): run it to its end here
                result = asyncio.run(_awaited(result))
        except Exception as error:  # the tool's own failure is the policy's to see, as in TRL's tool loop
            result, failed = f"Error: {type(error).__name__}: {error}", True
        text, cut = _result_text(result, self.max_observation_chars)
        info = {
            "success": self._success,
            "action_is_valid": True,
            "action_is_effective": not failed,
            "tool_error": failed,
            "tool_result_cut": cut,
        }
        return text, self._turn_reward, self._terminated, False, info

    def _apply(self, action_index: int) -> tuple[float, bool, bool]:
        raise NotImplementedError("tool environments act through step(); they have no action list")


async def _awaited(awaitable):
    return await awaitable


def _result_text(result: Any, max_chars: int) -> tuple[str, bool]:
    """A tool's return value as the text the policy reads (TRL's ``str(result)``; JSON for dicts and lists), cut to
    ``max_chars`` with a note of what was cut; and whether it was cut."""
    if isinstance(result, str):
        text = result
    elif isinstance(result, (dict, list)):
        text = json.dumps(result, ensure_ascii=False)
    else:
        text = str(result)
    if len(text) <= max_chars:
        return text, False
    note = ""
    for _ in range(2):  # the note's own length changes what is kept, and so the number it states
        kept = max(max_chars - len(note), 0)
        note = f"\n[cut: {len(text) - kept:,} more characters]"
    return text[: max(max_chars - len(note), 0)] + note, True


class TRLEnvironment(ToolTextEnv):
    """A class written for TRL's ``environment_factory``, played as a text environment in tool mode.

    Args:
        environment: the class (or any factory with no arguments), or its import path ``"package.module:Class"``; an
            import path reaches Ray's worker processes.
        tasks: the dataset rows an episode's ``reset(**task)`` receives, as TRL passes its dataset's rows: a list of
            dicts, or the import path of one. Episode seed s plays ``tasks[s % len(tasks)]``. A task's ``"prompt"``
            (a string, or chat messages whose last content is taken) is what the agent reads first, followed by what
            ``reset`` returns. None: ``reset()`` with no arguments.
        success_reward: an episode succeeds when ``get_reward()`` reaches this (None: when it is above 0).

    The reward is the environment's ``get_reward()`` (required: it is the one reward rllib_ragen trains on). It is read
    after each turn, and each turn is paid its change, so an episode's return is ``get_reward()`` at its end however it
    ends (a final reply, or the turn limit): ``get_reward`` must read the environment's state, as TRL's contract asks.
    """

    instructions = ""
    import_path_arguments = ("environment", "tasks")

    def __init__(
        self,
        environment: Any,
        tasks: Any = None,
        success_reward: float | None = None,
        render_mode: str | None = "ansi",
        max_observation_chars: int = 4096,
    ):
        super().__init__(render_mode, max_observation_chars)
        factory = load_import_path(environment, "environment") if isinstance(environment, str) else environment
        self.environment = factory()
        if isinstance(tasks, str):
            tasks = load_import_path(tasks, "tasks")
        self.tasks = list(tasks) if tasks is not None else None
        if self.tasks is not None and not all(isinstance(task, Mapping) for task in self.tasks):
            raise TypeError("tasks must be a list of dicts: the keyword arguments of each episode's reset().")
        if self.tasks == []:
            raise ValueError("tasks is empty: give at least one task, or None to reset() without arguments.")
        name = type(self.environment).__name__
        if not callable(getattr(self.environment, "reset", None)):
            raise TypeError(f"{name} has no reset(): TRL's environment contract needs one.")
        if not callable(getattr(self.environment, "get_reward", None)):
            raise TypeError(
                f"{name} has no get_reward(): rllib_ragen trains on the environment's own reward, so a "
                "TRL environment must define get_reward() (TRL's reward_funcs have no place here)."
            )
        if inspect.iscoroutinefunction(self.environment.get_reward):
            raise TypeError(f"{name}.get_reward is async; rllib_ragen calls environments synchronously.")
        self.success_reward = success_reward
        self._functions = {
            member: method
            for member, method in inspect.getmembers(self.environment, inspect.ismethod)
            if not member.startswith("_") and member not in ("reset", "get_reward")
        }
        if not self._functions:
            raise TypeError(f"{name} has no public methods besides reset and get_reward: it offers no tools.")
        self._prompt, self._reward_so_far = "", 0.0

    def tool_functions(self) -> dict[str, Callable]:
        return self._functions

    def _reset_state(self) -> None:
        task = {} if self.tasks is None else dict(self.tasks[int(self.np_random_seed or 0) % len(self.tasks)])
        prompt = _prompt_text(task.get("prompt", ""))
        observation = self.environment.reset(**task)
        self._prompt = "\n".join(part for part in (prompt, observation if isinstance(observation, str) else "") if part)
        self._reward_so_far = 0.0  # so that an episode's return is get_reward() at its end

    def _render_text(self) -> str:
        return self._prompt

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        observation, _, terminated, truncated, info = super().step(action)
        reward = self._read_reward()
        change, self._reward_so_far = reward - self._reward_so_far, reward
        self._success = reward >= self.success_reward if self.success_reward is not None else reward > 0
        info["success"] = self._success
        return observation, change, terminated, truncated, info

    def _read_reward(self) -> float:
        reward = self.environment.get_reward()
        if not isinstance(reward, numbers.Real) or not math.isfinite(reward):  # numpy's numbers too
            raise ValueError(
                f"{type(self.environment).__name__}.get_reward() returned {reward!r}: it must be a finite number."
            )
        return float(reward)

    def close(self) -> None:
        close = getattr(self.environment, "close", None)
        if callable(close):
            close()


def _prompt_text(prompt: Any) -> str:
    """A task's prompt as text: a string as it is, chat messages as the last message's content."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt and isinstance(prompt[-1], Mapping):
        return str(prompt[-1].get("content", ""))
    return ""
