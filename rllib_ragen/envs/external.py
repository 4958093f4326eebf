"""The shared base of the adapters that play another package's text games as :class:`TextEnv` environments.

An adapted game keeps its package's rules and rewards; the adapter supplies what rllib_ragen's environments promise:

- **Our action protocol.** One answer piece is one move, written as the game's move syntax without its wrapper
  (``1 3 4`` for a Sudoku move that GEM reads as ``\\boxed{1 3 4}``). A piece that does not match the syntax
  (``action_pattern``) is not sent: it changes nothing, pays 0 and is reported ``action_is_valid=False``, so the
  protocol charges the format penalty and counts it, as for our own environments.
- **The process's random generators untouched.** GEM and TextArena seed and draw from Python's (and numpy's)
  global generators. Every call into the package runs between a save and a restore of them, with the episode's
  own generator states swapped in, so an episode replays exactly from its seed and nothing else in the process
  (sampling seeds, other environments, resume) sees its draws.
- **A text card.** ``describe()`` is the game's own instructions plus the move syntax; the observation is what
  changed, with the current board where the game has one.
"""

from __future__ import annotations

import importlib
import random
import re
import threading
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

from .base import TRANSITION_SEED, TextEnv

# Move syntaxes the games of several packages share: (a regex a move must match in full, how to write one).
NUMBER = (r"\d+", "one whole number, e.g. 5")
CODE = (r"\d+(?: \d+)*", "the code's digits separated by spaces, e.g. 1 2 3 4")
SUDOKU_MOVE = (r"\d+ \d+ \d+", "row, column and digit separated by spaces, e.g. 1 3 4")
TOWERS = (r"[abc] ?,? ?[abc]", "the source and target towers, e.g. A C")
DIRECTION = (r"up|down|left|right", "one direction: up, down, left or right")

REWARDS = ("game", "success")
NO_MOVE_YET = "(no move yet)"  # the observation of a game that shows nothing before the first move

# One episode's generators are swapped into the process at a time: environment calls may run on several threads
# (an environment server's sessions). A call stuck inside a package holds the lock; the others give up after this
# long with an error, which the rollout engine counts, rather than wait forever behind it.
_GLOBAL_GENERATORS = threading.Lock()
GENERATOR_LOCK_TIMEOUT_S = 60.0


class AnyText(spaces.Text):
    """A text space that holds any string up to ``max_length`` characters: adapted games print what they like
    (box-drawing characters, emoji), so no fixed character set describes them."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


def move_matching(text: Any, syntax, timeout: float | None = None) -> str | None:
    """``text`` with its whitespace runs made single spaces, if that matches ``syntax`` in full (any non-empty
    text when ``syntax`` is None); else None. The move check of adapted games, here and behind a server.
    ``timeout``: the longest one match may take (``syntax`` then a ``regex`` pattern; past it ``TimeoutError``)."""
    if not isinstance(text, str) or not text.strip():
        return None
    move = " ".join(text.split())
    if syntax is None:
        return move
    matched = syntax.fullmatch(move) if timeout is None else syntax.fullmatch(move, timeout=timeout)
    return move if matched else None


def _generator_states() -> tuple:
    return random.getstate(), np.random.get_state()


def _set_generator_states(states: tuple) -> None:
    random.setstate(states[0])
    np.random.set_state(states[1])


class ExternalTextEnv(TextEnv):
    """A game from another package, seen as a :class:`TextEnv` (the adapters' shared machinery).

    Subclasses name their package (``module``, ``distribution``, ``extra``), its games' move syntaxes
    (``move_syntax``: game name -> (a regex a move must match in full, how to write one)) and the games it cannot
    play offline (``needs_downloads``), and implement ``game_name(game_id)``, ``_make(package, game_id, **kwargs)``,
    ``_reset_game(seed) -> (instructions, observation)`` and ``_step_game(move) -> (observation, reward,
    terminated, truncated, success)``.

    Args:
        game_id: the game's id in its package.
        reward: ``"game"``, the package's own rewards; or ``"success"``, 1 for the winning move and 0 otherwise.
            Packages pay partial credit (GEM's Guess The Number pays 1 - distance / range for a last guess that
            misses), which RL can learn to collect instead of winning; ``"success"`` pays for the goal alone, as
            ``SokobanEnv(reward="success")`` does.
        raw_replies: hand the package each whole reply as written (:attr:`TextEnv.raw_replies`), for it to find
            the move in as it does for its own agents (GEM's last ``\\boxed{}``, TextArena's ``[move]``): no move
            syntax is checked and nothing is wrapped, and ``describe()`` is the package's instructions alone.
        max_observation_chars: the observation space's length limit.
        **game_kwargs: passed to the package's ``make``.
    """

    module: ClassVar[str] = ""  # the package's import name
    distribution: ClassVar[str] = ""  # its name on PyPI
    extra: ClassVar[str] = ""  # the extra that installs it: rllib_ragen[<extra>]
    move_syntax: ClassVar[dict[str, tuple[str, str]]] = {}
    needs_downloads: ClassVar[tuple[str, ...]] = ()
    action_pattern: str | None = None  # a game without a known syntax takes any non-empty move
    action_syntax: str = "the move as the game's instructions write it"

    def __init__(
        self,
        game_id: str,
        reward: str = "game",
        raw_replies: bool = False,
        max_observation_chars: int = 16384,
        render_mode: str | None = "ansi",
        **game_kwargs: Any,
    ):
        if reward not in REWARDS:
            raise ValueError(f"reward={reward!r}: choose one of {REWARDS}.")
        if not isinstance(raw_replies, bool):
            raise ValueError(f"raw_replies={raw_replies!r} must be True or False.")
        self.raw_replies = raw_replies
        super().__init__(render_mode=render_mode, max_observation_chars=max_observation_chars)
        self.reward = reward
        self.observation_space = AnyText(max_length=max_observation_chars)
        self.action_space = AnyText(max_length=256)
        self.game_id = game_id
        self._episode_generators: tuple | None = None
        self._instructions, self._observation = "", ""
        name = self.game_name(game_id)
        if name in self.needs_downloads:
            raise ValueError(
                f"{game_id}: {self.module}'s {name} downloads NLTK word lists at run time "
                "(nltk.download), which needs a network; it is not offered here."
            )
        self.action_pattern, self.action_syntax = self.move_syntax.get(name, (None, self.action_syntax))
        self._action_regex = re.compile(self.action_pattern, re.IGNORECASE) if self.action_pattern else None
        try:
            package = importlib.import_module(self.module)
        except ImportError as error:
            raise ImportError(
                f"{game_id} needs the {self.distribution!r} package: pip install 'rllib_ragen[{self.extra}]' ({error})"
            ) from error
        with self._package_generators():  # the package may draw at construction (GEM resets in __init__)
            self.game = self._make(package, game_id, **game_kwargs)

    # ---- the package's generators, swapped in around every call --------------------------------------------
    @contextmanager
    def _package_generators(self):
        """Run the block with this episode's global-generator states, then put the process's own back."""
        if not _GLOBAL_GENERATORS.acquire(timeout=GENERATOR_LOCK_TIMEOUT_S):
            raise TimeoutError(
                f"{self.game_id}: another adapted game's call has held the process's random "
                f"generators for {GENERATOR_LOCK_TIMEOUT_S:g} s (stuck inside its package?)"
            )
        try:
            process = _generator_states()
            try:
                if self._episode_generators is not None:
                    _set_generator_states(self._episode_generators)
                yield
            finally:
                self._episode_generators = _generator_states()
                _set_generator_states(process)
        finally:
            _GLOBAL_GENERATORS.release()

    # ---- TextEnv ----------------------------------------------------------------------------------------
    def canonical_action(self, text: str) -> str | None:
        if self.raw_replies:  # the package finds the move itself
            return text if isinstance(text, str) and text.strip() else None
        return move_matching(text, self._action_regex)

    def describe(self) -> str:
        if self.raw_replies:
            return self._instructions.strip()
        return (
            f"{self._instructions.strip()}\n"
            f"Write each move inside <answer></answer> as {self.action_syntax}; this environment passes it to "
            "the game in the game's own format."
        ).strip()

    def state_key(self) -> str:
        return self._observation

    def _render_text(self) -> str:
        return self._observation

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super(TextEnv, self).reset(seed=seed)  # gymnasium's: seeds self.np_random
        self._success = False
        self.reset_options = options or {}
        if seed is None:  # the package needs a seed to be reproducible: draw one from our own seeded generator
            seed = int(self.np_random.integers(2**31 - 1))
        with self._package_generators():
            self._instructions, self._observation = self._reset_game(int(seed))
            transition_seed = self.reset_options.get(TRANSITION_SEED)
            if transition_seed is not None:  # same start, own luck: reseed what the package draws from next
                state = int(np.random.SeedSequence(transition_seed).generate_state(1)[0])
                random.seed(state)
                np.random.seed(state)
        return self._observation, {"success": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        move = self.canonical_action(action)
        if move is None:  # never sent: the protocol charges its format penalty
            return (
                self._observation,
                0.0,
                False,
                False,
                {"success": self._success, "action_is_valid": False, "action_is_effective": False},
            )
        with self._package_generators():
            observation, reward, terminated, truncated, self._success = self._step_game(move)
        if self.reward == "success":
            reward = float(self._success)
        effective = observation != self._observation or terminated
        self._observation = observation
        info = {"success": self._success, "action_is_valid": True, "action_is_effective": effective}
        return observation, float(reward), bool(terminated), bool(truncated), info

    # ---- hooks ------------------------------------------------------------------------------------------
    @staticmethod
    def game_name(game_id: str) -> str:
        """The game an id plays, the key of ``move_syntax`` and ``needs_downloads``."""
        raise NotImplementedError

    def _make(self, package: Any, game_id: str, **game_kwargs: Any) -> Any:
        raise NotImplementedError

    def _reset_game(self, seed: int) -> tuple[str, str]:
        raise NotImplementedError

    def _step_game(self, move: str) -> tuple[str, float, bool, bool, bool]:
        raise NotImplementedError
