"""The tiny model's tokenizer: boards encode one token per cell, in-process and after a save/load round trip."""

import gymnasium as gym
import pytest

from rllib_ragen.envs import registered_text_envs
from rllib_ragen.rollout.models import TOKENIZER_CORPUS_ENVS, build_tiny_tokenizer

# Every built-in environment with a board (the bandit has none), plus 8x8 two-box Sokoban at its own size.
BOARDS = [(env_id, {}) for env_id in registered_text_envs()
          if env_id.startswith("rllib_ragen/") and gym.make(env_id).unwrapped.legend]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    tokenizer = build_tiny_tokenizer(seed=0)
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    tokenizer.save_pretrained(path)
    return tokenizer, AutoTokenizer.from_pretrained(path)


def _pieces(tokenizer, text: str) -> list[str]:
    return [tokenizer.decode([i]) for i in tokenizer(text)["input_ids"]]


@pytest.mark.parametrize("env_id,kwargs", BOARDS)
def test_every_board_cell_is_one_token(tokenizers, env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    for seed in range(20):
        board, _ = env.reset(seed=seed)
        text = f"Turn 1. State:\n{board}\nYou have 10 actions left."
        expected = ["Turn", " ", "1", ".", " State", ":\n"] + [c for row in board.splitlines() for c in row + "\n"]
        for tokenizer in tokenizers:  # the exported tokenizer must encode exactly as the in-process one
            assert _pieces(tokenizer, text)[:len(expected) - 1] == expected[:-1], board


def test_box_on_target_mark_is_one_token(tokenizers):
    # √ is three UTF-8 bytes; it must still be one cell token, also next to other marks.
    for tokenizer in tokenizers:
        assert _pieces(tokenizer, "#√_√√X#") == ["#", "√", "_", "√", "√", "X", "#"]


def test_words_still_merge(tokenizers):
    tokenizer, _ = tokenizers
    # Board letters start ordinary words too; only merges that join board cells are removed.
    assert _pieces(tokenizer, "Phoenix Dragon Sokoban") == ["Phoenix", " Dragon", " Sokoban"]
    assert len(tokenizer("You have 10 actions left.")["input_ids"]) <= 8


def test_the_corpus_environments_are_registered_built_ins():
    assert set(TOKENIZER_CORPUS_ENVS) <= set(registered_text_envs())


def test_every_legend_symbol_of_every_built_in_environment_is_one_token(tokenizers):
    tokenizer, _ = tokenizers
    for env_id in registered_text_envs():
        for symbol in gym.make(env_id).unwrapped.legend:
            assert _pieces(tokenizer, f"#{symbol}{symbol}#") == ["#", symbol, symbol, "#"], (env_id, symbol)
