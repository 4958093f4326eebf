"""GEM's games (``pip install 'rllib_ragen[gem]'``, the ``gem-llm`` package) as rllib_ragen text environments.

Any id of GEM's registry plays as ``gem/<GEM id>`` with its colon written as a dot: ``make_text_env(
"gem/game.Sudoku-v0-easy")`` plays GEM's ``game:Sudoku-v0-easy``, and so does that id in a ``StarPOConfig``. It is
registered with gymnasium on first use (:func:`rllib_ragen.envs.ensure_registered`).
"""

from __future__ import annotations

from typing import Any

from .external import CODE, DIRECTION, NO_MOVE_YET, NUMBER, SUDOKU_MOVE, TOWERS, ExternalTextEnv

# GEM's word games download NLTK word lists at run time (``nltk.download``), which fails without a network.
NEEDS_DOWNLOADS = ("Wordle", "Hangman", "Crosswords", "WordSearch")
# The move syntax inside ``\boxed{...}`` that each game's step() parses (GEM's own regexes), and how to write it.
MOVE_SYNTAX = {
    "GuessTheNumber": NUMBER,
    "Mastermind": CODE,
    "Sudoku": SUDOKU_MOVE,
    "TowerofHanoi": TOWERS,
    "Minesweeper": (r"[a-z]+ \d+ \d+", "reveal or flag, then the row and column, e.g. reveal 3 2"),
    "Game2048": DIRECTION,
    "FifteenPuzzle": DIRECTION,
    "Sokoban": DIRECTION,
}
# A GEM game's success message: every game's winning step returns an observation that starts with it.
SUCCESS_PREFIX = "Congratulations"
# GEM's reasoning-gym tasks ("rg:<task>") end on the one answer with no message; reasoning-gym's own verifier scores
# it, 1.0 for a right answer.
REASONING_GYM_PREFIX = "rg:"


class GemTextEnv(ExternalTextEnv):
    """A game of GEM (General Experience Maker, axon-rl/gem), played through rllib_ragen's protocol.

    ## Description
    GEM's game runs unchanged; this class turns its interface into a :class:`TextEnv`.

    ## Action Space
    One move per answer piece, in the game's syntax without GEM's ``\\boxed{}`` (``MOVE_SYNTAX``); the adapter
    boxes it. Ids without an entry in ``MOVE_SYNTAX`` take any non-empty piece.

    ## Observation Space
    At reset, GEM's task suffix (the board, or "Enter your next guess."; "(no move yet)" where there is none);
    after a step, GEM's observation followed by its task suffix, so board games show the board every turn. GEM's
    instructions go to ``describe()``.

    ## Rewards
    GEM's own: its success, step and partial rewards as its games define them.

    ## Episode End
    GEM's. ``success`` is GEM's winning step: its observation starts with "Congratulations"; for GEM's
    reasoning-gym tasks (``rg:<task>``, one answer each) it is a reward of 1.0, reasoning-gym's verdict of a right
    answer. GEM ends those tasks with terminated and truncated both set; the answer ended the episode, not a time
    limit, so here it is terminated only.
    Where it differs from GEM: a piece that does not match the move syntax is never sent. GEM would end the episode
    with -0.1; here it changes nothing, and the protocol charges the format penalty and counts it.

    ## Arguments
    ``game_id``: GEM's id, e.g. ``"game:Sudoku-v0-easy"``; ``reward`` and ``raw_replies`` (GEM reads the last
    ``\\boxed{}`` of each whole reply itself): see :class:`~rllib_ragen.envs.external.ExternalTextEnv`; further
    keyword arguments go to ``gem.make``.
    """

    module, distribution, extra = "gem", "gem-llm", "gem"
    move_syntax, needs_downloads = MOVE_SYNTAX, NEEDS_DOWNLOADS

    @staticmethod
    def game_name(game_id: str) -> str:
        """``"Sudoku"`` for ``"game:Sudoku-v0-easy"``."""
        return game_id.split(":", 1)[-1].split("-", 1)[0]

    def _make(self, package: Any, game_id: str, **game_kwargs: Any) -> Any:
        return package.make(game_id, **game_kwargs)

    def _reset_game(self, seed: int) -> tuple[str, str]:
        instructions, info = self.game.reset(seed=seed)
        # Games without a task suffix (Mastermind) show nothing before the first move: the instructions open the
        # conversation already, through describe().
        return instructions, info.get("suffix") or NO_MOVE_YET

    def _step_game(self, move: str) -> tuple[str, float, bool, bool, bool]:
        text, reward, terminated, truncated, info = self.game.step(move if self.raw_replies else f"\\boxed{{{move}}}")
        suffix = info.get("suffix")
        observation = f"{text}\n{suffix}" if suffix and not terminated else text
        if self.game_id.startswith(REASONING_GYM_PREFIX):
            return observation, reward, True, False, float(reward) >= 1.0
        return observation, reward, terminated, truncated, bool(terminated and text.startswith(SUCCESS_PREFIX))
