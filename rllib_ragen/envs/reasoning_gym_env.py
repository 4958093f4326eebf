"""reasoning-gym's procedural tasks (``pip install 'rllib_ragen[reasoning_gym]'``) as rllib_ragen text environments.

Any task of reasoning-gym's registry plays as ``reasoning_gym/<task>``: ``make_text_env(
"reasoning_gym/basic_arithmetic")``, or that id in a ``StarPOConfig``. It is registered with gymnasium on first use
(:func:`rllib_ragen.envs.ensure_registered`). The reward is reasoning-gym's own verifier.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from .external import ExternalTextEnv

# Built datasets, shared by every environment of the same task and settings: an entry is generated from its own
# seed when read, so readers never disturb each other.
_DATASETS: dict[tuple, Any] = {}
_DATASETS_LOCK = threading.Lock()

INSTRUCTIONS = (
    "Solve the task. Write your final answer alone inside <answer></answer>, in the form the task asks "
    "for; it is checked exactly as written."
)


class ReasoningGymTextEnv(ExternalTextEnv):
    """One task of reasoning-gym (open-thought/reasoning-gym), one question an episode.

    ## Description
    reasoning-gym generates each question from a seed. The environment builds the task's dataset once
    (``size`` entries from ``dataset_seed``); ``reset(seed=s)`` plays entry ``s % size``, so a seed always gives the
    same question, and seeds below ``size`` give different ones.

    ## Action Space
    The answer, as written (stripped at the ends; inner lines and spaces kept: a grid answer is several lines).
    An answer that splits on the action separator plays its first piece: for tasks whose answers may hold ``||``,
    set ``action_separator=None``.

    ## Observation Space
    The question. ``describe()`` says to answer inside ``<answer></answer>``.

    ## Rewards
    reasoning-gym's verifier (``score_answer``): 1.0 for a right answer, partial credit where the task gives it.
    ``reward="success"`` pays 1 for a right answer and 0 otherwise.

    ## Episode End
    One answer ends the episode (terminated). ``success``: the verifier's score is 1.0.

    ## Arguments
    ``game_id``: the task's name, e.g. ``"basic_arithmetic"``. ``size`` (100,000) and ``dataset_seed`` (0): the
    dataset the seeds index (built once a process; a few tasks refuse a size this large, e.g. ``word_ladder``:
    give a smaller one). Further keyword arguments are the task's own settings (``rg.create_dataset``).
    """

    module, distribution, extra = "reasoning_gym", "reasoning-gym", "reasoning_gym"
    max_turns = 1

    def __init__(
        self,
        game_id: str,
        size: int = 100_000,
        dataset_seed: int = 0,
        reward: str = "game",
        max_observation_chars: int = 16384,
        render_mode: str | None = "ansi",
        **task_config: Any,
    ):
        for name, value, least in (("size", size, 1), ("dataset_seed", dataset_seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be a whole number >= {least}.")
        if "raw_replies" in task_config:
            raise ValueError(
                "raw_replies: reasoning-gym's verifiers read the answer alone; the protocol hands them "
                "the <answer> text (for GEM's boxed form, play gem/rg.<task> with raw_replies=True)."
            )
        self.size, self.dataset_seed = size, dataset_seed
        self._entry: dict | None = None
        super().__init__(
            game_id, reward=reward, max_observation_chars=max_observation_chars, render_mode=render_mode, **task_config
        )

    @staticmethod
    def game_name(game_id: str) -> str:
        return game_id

    def _make(self, package: Any, game_id: str, **task_config: Any) -> Any:
        from reasoning_gym.factory import DATASETS

        if game_id not in DATASETS:
            raise ValueError(
                f"reasoning_gym/{game_id}: reasoning-gym has no task {game_id!r}; its tasks: "
                f"{', '.join(sorted(DATASETS))}."
            )
        key = (game_id, self.size, self.dataset_seed, json.dumps(task_config, sort_keys=True, default=repr))
        with _DATASETS_LOCK:
            if key not in _DATASETS:  # some tasks take seconds to build (acre: 29 s at 100,000): once a process
                _DATASETS[key] = package.create_dataset(game_id, size=self.size, seed=self.dataset_seed, **task_config)
            return _DATASETS[key]

    def canonical_action(self, text: str) -> str | None:
        if not isinstance(text, str) or not text.strip():
            return None
        return text.strip()

    def describe(self) -> str:
        return INSTRUCTIONS

    def _reset_game(self, seed: int) -> tuple[str, str]:
        self._entry = self.game[int(seed) % self.size]
        return INSTRUCTIONS, self._entry["question"]

    def _step_game(self, move: str) -> tuple[str, float, bool, bool, bool]:
        score = float(self.game.score_answer(answer=move, entry=self._entry))
        if not np.isfinite(score):
            raise ValueError(f"reasoning_gym/{self.game_id}'s verifier scored {move!r} {score}.")
        return f"Scored {score:g}.", score, True, False, score >= 1.0

    def _render_text(self) -> str:
        return self._observation
