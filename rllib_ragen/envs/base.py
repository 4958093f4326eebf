"""The base class shared by every text environment.

A text environment is a plain gymnasium environment whose observations are strings (the rendered state) and
whose actions are strings from a small vocabulary (``"Up"``, ``"Dragon"``, ...). It knows nothing about
language models: the agent's reply is turned into these action strings by :mod:`rllib_ragen.rollout.protocol`.
"""

from __future__ import annotations

import importlib
import re
import string
from typing import Any, ClassVar, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def load_import_path(path: str, what: str = "an import path") -> Any:
    """The object an import path ``"package.module:Name"`` (``Name`` may be dotted: ``"module:Class.attr"``) names;
    gymnasium's entry points and TRL's factories are written so. A path of another shape fails naming ``what``."""
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"{what} {path!r} must be an import path 'package.module:Name'.")
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


# Observations may contain any printable ASCII plus the few non-ASCII symbols our grids use.
OBSERVATION_CHARSET = frozenset(string.printable) | frozenset("√")
ACTION_CHARSET = frozenset(string.ascii_letters + string.digits + " _-")
# The reset option that reseeds an episode's chance draws after its initial state is built (see TextEnv).
TRANSITION_SEED = "transition_seed"


def check_effect_claims(
    reasoning: str | None, truth: Mapping[str, str], effect_words: Sequence[str]
) -> tuple[int, int]:
    """``(checked, true)`` for claims "<move> <effect>" in ``reasoning`` ("Up wall", "left push to target").

    ``truth`` maps each move name to what it would do now, ``effect_words`` is every word an effect can be.
    Matching is case-insensitive, the longest effect first ("push to target" is not read as "push"); a move
    claimed twice counts once, the first claim. The shared check behind the grid games' ``reasoning_claims``.
    """
    moves = "|".join(re.escape(move) for move in truth)
    effects = "|".join(re.escape(word) for word in sorted(effect_words, key=len, reverse=True))
    claimed: dict[str, str] = {}
    for move, effect in re.findall(rf"\b({moves})\s+({effects})\b", reasoning or "", re.IGNORECASE):
        claimed.setdefault(move.lower(), effect.lower())
    actual = {move.lower(): effect.lower() for move, effect in truth.items()}
    return len(claimed), sum(actual[move] == effect for move, effect in claimed.items())


def checks_reasoning_claims(env_or_class) -> bool:
    """Whether an environment (an instance, wrapped or not, or a class) checks claims about its state: it has a
    ``reasoning_claims`` of its own, not :class:`TextEnv`'s default, which checks none."""
    if not isinstance(env_or_class, type):
        env_or_class = type(getattr(env_or_class, "unwrapped", env_or_class))
    method = getattr(env_or_class, "reasoning_claims", None)
    return callable(method) and method is not TextEnv.reasoning_claims


class TextEnv(gym.Env[str, str]):
    """A gymnasium environment with text observations and named text actions.

    Subclasses set ``action_names`` (canonical spelling, matched case-insensitively), ``legend`` (symbol ->
    meaning) and an ``instructions`` string, and implement three hooks:

    - ``_reset_state()``: build the initial state from ``self.np_random`` (already seeded by ``reset``) and
      ``self.reset_options`` (the ``options`` dict of ``reset``);
    - ``_apply(action_index) -> (reward, terminated, effective)``: advance the state, drawing any chance
      (payoffs, slips) from ``self.np_random`` at the time of the step;
    - ``_render_text() -> str``: the state as text.

    ``step`` accepts any string. One that is not in the vocabulary is a legal call that leaves the state
    unchanged, pays 0 and reports ``action_is_valid=False``; penalising it is the action protocol's job.

    ``reset(seed=s)`` fixes the initial state and, by default, every later chance draw too: episodes reset from
    one seed repeat each other's luck. ``options={TRANSITION_SEED: t}`` keeps the initial state of ``s`` and
    draws the transitions from a generator seeded by ``t`` instead (an int or a sequence of ints), so that a
    group's episodes can share a start but not their luck (``StarPOConfig.independent_transitions``).

    Every ``step`` info dict carries ``success``, ``action_is_valid`` and ``action_is_effective`` (the state
    changed).

    ``max_turns`` caps the agent's replies per episode for games that are single-turn (or short) by nature;
    the rollout engine plays ``min(max_turns, RolloutConfig.max_turns)``. None leaves it to the config.

    ``raw_replies``: the environment parses the model's text itself (as SkyRL-Gym, verifiers and GEM's games do).
    The rollout engine then hands it each whole reply, thinking and tags included, as the turn's one action
    (``canonical_action`` still decides whether it is one: None is a format error), and the turn message asks for
    the format of the environment's instructions instead of ``<answer>``.

    ``tools``: function schemas (OpenAI's shape, as ``transformers.utils.get_json_schema`` writes them). An environment
    with tools is played in tool mode (``rollout/tools.py``): each call reaches ``step`` as the JSON
    ``{"name": ..., "arguments": {...}}`` and its result is the observation ``step`` returns. :class:`ToolTextEnv`
    builds both from methods.

    ``import_path_arguments``: the constructor arguments this environment imports when given as text (an import path
    ``"package.module:Name"``; importing a module runs its code). A run folder's settings that name one are refused
    by the readers unless the user allows it (``rllib_ragen.jobs.readers.trial_config``).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

    action_names: ClassVar[Sequence[str]] = ()
    legend: ClassVar[Mapping[str, str]] = {}
    instructions: str = ""
    max_turns: ClassVar[int | None] = None
    raw_replies: bool = False
    tools: Sequence[Mapping] = ()
    import_path_arguments: ClassVar[tuple[str, ...]] = ()

    def __init__(self, render_mode: str | None = "ansi", max_observation_chars: int = 4096):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode={render_mode!r}: text environments only render 'ansi' (or None).")
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=max_observation_chars, charset=OBSERVATION_CHARSET)
        self.action_space = spaces.Text(max_length=32, charset=ACTION_CHARSET)
        self._action_lookup = {name.lower(): i for i, name in enumerate(self.action_names)}
        self._success = False
        self.reset_options: dict = {}

    # ---- vocabulary -------------------------------------------------------------------------------------
    def lookup_action(self, text: str) -> int | None:
        """Index of the action named ``text`` (case and surrounding whitespace ignored), or None."""
        if not isinstance(text, str):
            return None
        return self._action_lookup.get(text.strip().lower())

    def canonical_action(self, text: str) -> str | None:
        """The action one piece of the agent's answer names, spelled as ``step`` takes it; None if it names none.

        The action protocol executes what this returns and charges the format penalty for a None. Default: the
        canonical spelling of a name in ``action_names``. Environments with an open action set (a Sudoku move
        ``"1 3 4"``, a guessed number) override it with their own syntax check (see
        :class:`~rllib_ragen.envs.external.ExternalTextEnv`).
        """
        index = self.lookup_action(text)
        return None if index is None else self.action_names[index]

    def optimal_solution_length(self) -> int | None:
        """Fewest actions that solve the current state, where the environment can compute it (None otherwise).
        Validation success is reported per optimal length with it (``rllib_ragen.jobs.validation_states``)."""
        return None

    def reasoning_claims(self, reasoning: str) -> tuple[int, int]:
        """``(checked, true)``: how many claims about the current state ``reasoning`` makes that this environment
        can check, and how many of them hold. The rollout engine asks before each reply is executed and reports
        ``reasoning_grounded`` (true / checked) so that a run shows whether what the agent says about the state is
        so, and ``ungrounded_reasoning_penalty`` counts the actions whose effect is not stated truly, so at most one
        claim per action may count. Default: (0, 0), nothing checkable."""
        return 0, 0

    def describe(self) -> str:
        """Instructions, the symbol legend and the action list: everything an agent needs before turn one."""
        parts = [self.instructions.strip()]
        if self.legend:
            parts.append("Symbols: " + ", ".join(f"{s} {meaning}" for s, meaning in self.legend.items()) + ".")
        parts.append("Valid actions: " + ", ".join(self.action_names) + ".")
        return "\n".join(p for p in parts if p)

    @property
    def success(self) -> bool:
        """Whether the episode's goal has been reached (the value every ``step`` info reports)."""
        return self._success

    def state_key(self) -> str:
        """A key of the current state: turns whose states have equal keys are compared with each other by GiGPO's
        step-level advantage (its "anchor states"). Default: the rendered observation. Override it when the text
        shows less or more than the state (hidden information, a turn counter)."""
        return self._render_text()

    @property
    def observation(self) -> str:
        """The current state as text (what the last ``reset`` or ``step`` returned)."""
        return self._render_text()

    # ---- gymnasium API ----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self._success = False
        self.reset_options = options or {}  # for _reset_state, e.g. a fixed level to play
        self._reset_state()
        transition_seed = self.reset_options.get(TRANSITION_SEED)
        if transition_seed is not None:  # same start, own luck: later draws come from this generator
            self.np_random = np.random.default_rng(np.random.SeedSequence(transition_seed))
        return self._render_text(), {"success": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        index = self.lookup_action(action)
        if index is None:
            reward, terminated, effective = 0.0, False, False
        else:
            reward, terminated, effective = self._apply(index)
        info = {"success": self._success, "action_is_valid": index is not None, "action_is_effective": effective}
        return self._render_text(), float(reward), bool(terminated), False, info

    def render(self) -> str | None:
        return None if self.render_mode is None else self._render_text()

    # ---- hooks ------------------------------------------------------------------------------------------
    def _reset_state(self) -> None:
        raise NotImplementedError

    def _apply(self, action_index: int) -> tuple[float, bool, bool]:
        raise NotImplementedError

    def _render_text(self) -> str:
        raise NotImplementedError
