"""TextArena's single-player games (``pip install 'rllib_ragen[textarena]'``) as rllib_ragen text environments.

Any single-player id of TextArena's registry plays as ``textarena/<id>``: ``make_text_env(
"textarena/Sudoku-v0-very-easy-train")``, or that id in a ``StarPOConfig``. It is registered with gymnasium on
first use (:func:`rllib_ragen.envs.ensure_registered`). Prefer
the ``-train`` ids: their observation is the board (or the game's messages), not a transcript of the chat.
"""

from __future__ import annotations

from typing import Any

from .external import CODE, DIRECTION, NO_MOVE_YET, NUMBER, SUDOKU_MOVE, TOWERS, ExternalTextEnv

# TextArena's word games download NLTK word lists when their module is imported, which fails without a network.
NEEDS_DOWNLOADS = (
    "Codenames",
    "Crosswords",
    "DontSayIt",
    "Hangman",
    "LetterAuction",
    "SpellingBee",
    "WordChains",
    "WordLadder",
    "WordSearch",
    "Wordle",
)
# The move syntax inside TextArena's square brackets that each game's step() parses, and how to write it.
MOVE_SYNTAX = {
    "GuessTheNumber": NUMBER,
    "Mastermind": CODE,
    "Sudoku": SUDOKU_MOVE,
    "TowerOfHanoi": TOWERS,
    "2048": DIRECTION,
    "Minesweeper": (r"\d+ \d+", "the row and column to reveal, e.g. 3 2"),
    # TextArena's grid games also take w, a, s, d for the directions.
    "FrozenLake": (DIRECTION[0] + "|w|a|s|d", DIRECTION[1]),
    "Sokoban": (DIRECTION[0] + "|w|a|s|d", DIRECTION[1]),
}


class TextArenaTextEnv(ExternalTextEnv):
    """A single-player game of TextArena, played through rllib_ragen's protocol.

    ## Description
    TextArena's game runs unchanged, with the wrappers its id registers (for ``-train`` ids, a board or
    game-message observation and its action formatter, which puts the move in square brackets).

    ## Action Space
    One move per answer piece, in the game's syntax without the brackets (``MOVE_SYNTAX``). Ids without an entry
    in ``MOVE_SYNTAX`` take any non-empty piece.

    ## Observation Space
    TextArena's observation string without its opening prompt, which goes to ``describe()``: the current board,
    or the game's messages so far. At the end, TextArena's reason for it ("Congratulations! ...") is added.

    ## Rewards
    TextArena's: its games pay only when the game ends (``close()``: 1 for a win, else the share completed), so
    every step pays 0 but the last.

    ## Episode End
    TextArena's, including its rule that a second invalid move in a row ends the game. ``success``: the final reward
    is 1 and the game did not end on an invalid move. Where it differs from TextArena: a piece that does not match
    the move syntax is never sent (TextArena would count it as an invalid move); the protocol charges the format
    penalty for it instead.

    ## Arguments
    ``game_id``: TextArena's id, e.g. ``"Sudoku-v0-very-easy-train"``; further keyword arguments go to ``ta.make``.
    """

    module, distribution, extra = "textarena", "textarena", "textarena"
    move_syntax, needs_downloads = MOVE_SYNTAX, NEEDS_DOWNLOADS

    @staticmethod
    def game_name(game_id: str) -> str:
        """``"Sudoku"`` for ``"Sudoku-v0-very-easy-train"``."""
        return game_id.split("-", 1)[0]

    def _make(self, package: Any, game_id: str, **game_kwargs: Any) -> Any:
        self._prompt_type = package.ObservationType.PROMPT
        return package.make(game_id, **game_kwargs)

    def _reset_game(self, seed: int) -> tuple[str, str]:
        try:
            self.game.reset(num_players=1, seed=seed)
        except AssertionError as error:  # TextArena's states assert their player count
            raise ValueError(f"textarena/{self.game_id} is not a single-player game: {error}") from error
        _, text = self.game.get_observation()
        self._prompt = self._opening_prompt()
        return self._prompt, self._without_prompt(text)

    def _step_game(self, move: str) -> tuple[str, float, bool, bool, bool]:
        done, _ = self.game.step(move)
        _, text = self.game.get_observation()
        observation, reward, success = self._without_prompt(text), 0.0, False
        if done:
            rewards, game_info = self.game.close()
            reward = float(rewards[0])
            outcome = game_info[0]
            success = reward >= 1.0 and not outcome.get("invalid_move", False)
            observation = f"{observation}\n{outcome.get('reason', '')}".strip()
        return observation, reward, bool(done), False, success

    def _opening_prompt(self) -> str:
        """The game's opening prompt, as its observation wrapper keeps it ("" where no wrapper keeps one)."""
        layer = self.game
        while layer is not None:
            kept = getattr(layer, "__dict__", {}).get("full_observations")
            if kept:
                return next((message for _, message, kind in kept.get(0, []) if kind == self._prompt_type), "")
            layer = getattr(layer, "__dict__", {}).get("env")
        return ""

    def _without_prompt(self, text: str) -> str:
        if not isinstance(text, str):  # wrappers without a string observation return the raw message list
            text = "\n".join(message for _, message, _ in text)
        if self._prompt and self._prompt in text:
            text = text.replace(self._prompt, "", 1)
        return text.strip() or NO_MOVE_YET
