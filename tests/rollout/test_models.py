"""The tiny model's tokenizer: boards encode one token per cell, in-process and after a save/load round trip."""

import gymnasium as gym
import pytest

from rllib_ragen.envs import BUILT_IN_TEXT_ENVS, registered_text_envs
from rllib_ragen.rollout.tiny_model import GRID_LETTERS, GRID_MARKS, TOKENIZER_CORPUS_ENVS, build_tiny_tokenizer

# Every built-in environment with a board (the bandit has none), plus 8x8 two-box Sokoban at its own size.
BOARDS = [
    (env_id, {})
    for env_id in registered_text_envs()
    if env_id.startswith("rllib_ragen/") and gym.make(env_id).unwrapped.legend
]


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
            assert _pieces(tokenizer, text)[: len(expected) - 1] == expected[:-1], board


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
    for env_id in BUILT_IN_TEXT_ENVS:
        for symbol in gym.make(env_id).unwrapped.legend:
            assert _pieces(tokenizer, f"#{symbol}{symbol}#") == ["#", symbol, symbol, "#"], (env_id, symbol)


def test_the_tokenizer_knows_every_built_in_legend_symbol_without_reading_the_registry():
    """The tiny tokenizer's ids no longer depend on which environments exist: its board symbols are a frozen set.
    A new built-in environment whose legend brings a symbol outside it would encode that symbol merged with its
    neighbours; adding the symbol is a conscious change of every tiny-model token id (re-measure the results)."""
    legends = {symbol for env_id in BUILT_IN_TEXT_ENVS for symbol in gym.make(env_id).unwrapped.legend}
    assert legends <= GRID_LETTERS | GRID_MARKS
    assert all(symbol.isalpha() for symbol in GRID_LETTERS) and not any(mark.isalpha() for mark in GRID_MARKS)


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    from rllib_ragen.rollout.models import load_policy

    folder = tmp_path_factory.mktemp("tiny")
    model, tokenizer = load_policy("tiny")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _edit_config(folder, **fields):
    import json

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def _drop_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)


def _truncate_weights(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


# Each of these loaded silently (a one-token tokenizer, BERT weights drawn at random) or failed with a raw
# torch/transformers/safetensors error, some only at the first train().
@pytest.mark.parametrize(
    "break_it, message",
    [
        (
            lambda f: _edit_config(f, hidden_size=-5),
            "config.json, weights (*.safetensors) or tokenizer files did not load",
        ),
        (lambda f: _edit_config(f, vocab_size=10), "differ in shape from what config.json describes"),
        (lambda f: _edit_config(f, model_type="bert"), "model_type 'bert' does not match the weights"),
        (_drop_tokenizer, "has no tokenizer file"),
        (_truncate_weights, "SafetensorError"),
    ],
)
def test_a_broken_model_folder_fails_at_build_algo_naming_the_folder_and_the_file(
    saved_tiny, tmp_path, break_it, message
):
    import shutil

    from rllib_ragen import StarPOConfig

    folder = tmp_path / "model"
    shutil.copytree(saved_tiny, folder)
    break_it(folder)
    config = (
        StarPOConfig()
        .environment("rllib_ragen/Bandit-v0")
        .training(num_groups=2, group_size=2)
        .rl_module(model_config={"model": str(folder)})
    )
    config.validate()  # a folder with a config.json: what can be told without loading it is fine
    with pytest.raises(Exception) as error:
        config.build_algo()
    assert f"model={str(folder)!r}" in str(error.value) and message in str(error.value)


@pytest.mark.slow
def test_a_checkpoint_restored_after_its_model_folder_was_replaced_names_the_folder(saved_tiny, tmp_path, ray_session):
    # It failed with torch's "size mismatch for critic.head.weight" after a restore that had built everything.
    import shutil

    from rllib_ragen import StarPO, StarPOConfig
    from rllib_ragen.rollout.tiny_model import build_tiny_model, build_tiny_tokenizer

    folder = tmp_path / "model"
    shutil.copytree(saved_tiny, folder)
    config = (
        StarPOConfig()
        .environment("rllib_ragen/Bandit-v0")
        .training(num_groups=2, group_size=2)
        .rl_module(model_config={"model": str(folder)})
    )
    algo = config.build_algo()
    try:
        checkpoint = algo.save_to_path(tmp_path / "checkpoint")
    finally:
        algo.stop()
    shutil.rmtree(folder)  # another model of the same architecture, twice as wide, in its place
    tokenizer = build_tiny_tokenizer(seed=0)
    build_tiny_model(tokenizer, hidden_size=256).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(
        ValueError,
        match=rf"do not fit the model built from model={str(folder)!r}: .* is \(\d+, "
        r"128\) in the weights loaded and \(\d+, 256\) in the model.*config.json",
    ):
        StarPO.from_checkpoint(checkpoint)


def test_a_model_cast_to_bfloat16_plays_as_its_saved_copy_loaded_in_bfloat16(tmp_path):
    """The sampler casts its float32 copy to rollout_dtype; a saved policy is loaded in that dtype. transformers keeps
    RoPE's inverse frequencies in float32 when it loads in bfloat16, so the cast must too, or the two place positions
    differently and a saved policy does not play as the run's sampler did."""
    import torch

    from rllib_ragen.rollout.tiny_model import build_tiny_model
    from rllib_ragen.rollout.models import cast_weights, load_policy

    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, seed=3).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_policy(str(tmp_path), dtype="bfloat16")
    cast = cast_weights(load_policy(str(tmp_path), dtype="float32")[0], torch.bfloat16)
    assert {n: b.dtype for n, b in cast.named_buffers()} == {n: b.dtype for n, b in loaded.named_buffers()}
    assert any(b.dtype == torch.float32 for b in cast.buffers())  # the inverse frequencies stayed float32
    assert all(p.dtype == torch.bfloat16 for p in cast.parameters())
    ids = torch.arange(1, 200).unsqueeze(0)  # positions far enough for rounded frequencies to show
    with torch.no_grad():
        assert torch.equal(cast(ids).logits, loaded(ids).logits)
        rounded = load_policy(str(tmp_path), dtype="float32")[0].to(torch.bfloat16)  # what .to() did before
        assert not torch.equal(rounded(ids).logits, loaded(ids).logits)
