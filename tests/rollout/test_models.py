"""The tiny model's tokenizer: boards encode one token per cell, in-process and after a save/load round trip."""

import gymnasium as gym
import pytest

import rllib_ragen  # noqa: F401  (registers the envs)
from rllib_ragen.rollout.models import build_tiny_tokenizer

BOARDS = [("rllib_ragen/FrozenLake-v0", {}), ("rllib_ragen/Sokoban-v0", {}),
          ("rllib_ragen/SokobanAltSymbols-v0", {}), ("rllib_ragen/Sokoban-v0", {"dim": 8, "num_boxes": 2})]


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
