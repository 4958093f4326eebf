"""HF backend: prefix caching must change speed only, never samples or log-probs."""

import pytest
import torch

from rllib_ragen.rollout.backends import HFBackend, SamplingParams, _sample
from rllib_ragen.rollout.engine import RolloutConfig, RolloutEngine
from rllib_ragen.rollout.models import build_tiny_model, load_policy


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_policy("tiny", seed=0)


def _play(tiny, prefix_cache):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, prefix_cache=prefix_cache)
    engine = RolloutEngine(RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3), backend, tokenizer)
    # A stop string the random model hits often, so rows stop at different steps and leave holes.
    params = SamplingParams(max_new_tokens=20, stop_strings=("e",))
    trajectories, _ = engine.rollout([1, 2, 3], 2, params, sample_seed=7)
    return trajectories, backend.stats


def test_prefix_cache_is_equivalent_to_full_prefill(tiny):
    cached, cached_stats = _play(tiny, True)
    fresh, fresh_stats = _play(tiny, False)
    assert [t.token_ids for t in cached] == [t.token_ids for t in fresh]
    for a, b in zip(cached, fresh):
        assert torch.allclose(torch.tensor(a.behaviour_logprobs), torch.tensor(b.behaviour_logprobs), atol=1e-5)
    assert len({len(span) for t in cached for span in [range(*s) for s in t.turn_spans]}) > 1  # rows stopped apart
    assert fresh_stats["prefilled_tokens"] == fresh_stats["prompt_tokens"]
    assert cached_stats["prefilled_tokens"] < 0.5 * cached_stats["prompt_tokens"]


def test_load_weights_drops_the_cache(tiny):
    model, tokenizer = tiny
    other = build_tiny_model(tokenizer, seed=1)  # same vocabulary, different weights
    backend = HFBackend(build_tiny_model(tokenizer, seed=0), tokenizer)
    prompt = tokenizer("<|im_start|>user\nTurn 1. State:\n#P_O#<|im_end|>\n")["input_ids"]
    first = backend.generate([prompt], SamplingParams(max_new_tokens=8, stop_strings=()), seed=0)[0]
    backend.load_weights(other.state_dict())
    follow_up = prompt + first.token_ids + prompt
    second = backend.generate([follow_up], SamplingParams(max_new_tokens=8, stop_strings=()), seed=0)[0]
    ids = torch.tensor([follow_up + second.token_ids])
    with torch.no_grad():
        logits = other(input_ids=ids).logits[0, len(follow_up) - 1:-1]
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(follow_up):, None]).squeeze(-1)
    assert torch.allclose(expected, torch.tensor(second.logprobs), atol=1e-5)


def test_top_k_and_top_p_shape_sampling_not_the_logprob():
    logits = torch.tensor([[3.0, 2.0, 1.0, -5.0]]).repeat(2000, 1)
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = _sample(logits, SamplingParams(temperature=1.0, top_k=2), generator)
    assert set(tokens.tolist()) == {0, 1}
    full = torch.log_softmax(logits[0], -1)
    assert torch.allclose(logprobs, full[tokens])
    # top_p=0.5: token 0 alone holds 66.5% of the mass, so only it survives.
    tokens, _ = _sample(logits, SamplingParams(temperature=1.0, top_p=0.5), generator)
    assert set(tokens.tolist()) == {0}
    tokens, logprobs = _sample(logits[:1], SamplingParams(temperature=0.0), generator)
    assert tokens.item() == 0 and torch.allclose(logprobs, full[:1])


def test_the_growing_cache_layer_holds_what_hugging_faces_layer_holds():
    from transformers.cache_utils import DynamicLayer

    from rllib_ragen.rollout.backends import _growing_kv_layer

    ours, theirs = _growing_kv_layer()(), DynamicLayer()
    generator = torch.Generator().manual_seed(0)
    # A prefill (a buffer of 200 slots), decode steps past it, a row selection, a crop and a repeat.
    steps = [("update", 100), *[("update", 1)] * 120, ("select", [2, 0]), ("update", 3), ("crop", -5), ("update", 1),
             ("repeat", 2), ("update", 2)]
    batch = 3
    for op, arg in steps:
        if op == "update":
            k, v = (torch.randn(batch, 2, arg, 4, generator=generator) for _ in range(2))
            got, expected = ours.update(k, v), theirs.update(k, v)
            assert all(torch.equal(a, b) for a, b in zip(got, expected))
        elif op == "select":
            ours.batch_select_indices(torch.tensor(arg)), theirs.batch_select_indices(torch.tensor(arg))
            batch = len(arg)
        elif op == "crop":
            ours.crop(arg), theirs.crop(arg)
        else:
            ours.batch_repeat_interleave(arg), theirs.batch_repeat_interleave(arg)
            batch *= arg
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
        assert ours.get_seq_length() == theirs.get_seq_length()
    assert ours._keys.shape[-2] == 402  # full at 200 tokens, it grew to twice the 201 needed


def test_rollouts_are_the_same_with_hugging_faces_own_cache(tiny, monkeypatch):
    from transformers import DynamicCache

    import rllib_ragen.rollout.backends as backends

    ours, _ = _play(tiny, True)
    monkeypatch.setattr(backends, "_new_cache", lambda model: DynamicCache(config=model.config))
    theirs, _ = _play(tiny, True)
    assert [t.token_ids for t in ours] == [t.token_ids for t in theirs]
    assert [t.behaviour_logprobs for t in ours] == [t.behaviour_logprobs for t in theirs]  # bit for bit


def test_only_plain_full_attention_layers_are_swapped_for_growing_ones(tiny):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.cache_utils import DynamicLayer

    from rllib_ragen.rollout.backends import _growing_kv_layer, _new_cache

    model, tokenizer = tiny
    assert all(type(layer) is _growing_kv_layer() for layer in _new_cache(model).layers)
    sliding = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                           use_sliding_window=True, sliding_window=64, max_window_layers=0))
    layers = _new_cache(sliding).layers  # Hugging Face's sliding-window layers, kept as they are
    assert layers and not any(type(layer) in (DynamicLayer, _growing_kv_layer()) for layer in layers)
