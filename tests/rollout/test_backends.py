"""HF backend: prefix caching must change speed only, never samples or log-probs."""

import copy
from unittest.mock import patch

import pytest
import torch

from rllib_ragen.rollout import kv_cache
from rllib_ragen.rollout.kv_cache import _grown

from rllib_ragen.rollout.backends import HFBackend, SamplingParams, _draw, _sample
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.tiny_model import build_tiny_model
from rllib_ragen.rollout.models import load_policy


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
    # Without the prefix cache every prompt is prefilled whole, but each group's first prompt once: 3 groups of 2
    # open with 3 distinct prompts, each read once instead of twice.
    first_prompts = sum(len(t.token_ids[: t.turn_spans[0][0]]) for t in fresh[::2])
    assert fresh_stats["prefilled_tokens"] == fresh_stats["prompt_tokens"] - first_prompts
    assert cached_stats["prefilled_tokens"] < 0.5 * cached_stats["prompt_tokens"]


def test_a_groups_shared_first_prompt_is_prefilled_once_and_sampled_exactly(tiny):
    """Each group's episodes open with one prompt: it is read once, its cache rows repeated for the group, and every
    sampled token's log-prob still equals a fresh forward pass over the episode's tokens."""
    from rllib_ragen.objectives import token_logprobs

    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, prefix_cache=False)
    engine = RolloutEngine(RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=1), backend, tokenizer)
    trajectories, _ = engine.rollout([1, 2], 4, SamplingParams(max_new_tokens=12, stop_strings=()), sample_seed=3)
    firsts = [t.turn_spans[0][0] for t in trajectories]  # each episode's first prompt length
    assert backend.stats["prefilled_tokens"] == firsts[0] + firsts[4] and backend.stats["prompt_tokens"] == sum(firsts)
    assert len({tuple(t.token_ids[firsts[0] :]) for t in trajectories[:4]}) > 1  # the group's replies differ
    for t in trajectories:
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            fresh = token_logprobs(model(input_ids=ids).logits, ids)[0]
        sampled = torch.tensor(t.response_mask).bool()
        assert torch.allclose(fresh[sampled], torch.tensor(t.behaviour_logprobs)[sampled], atol=1e-5)


def test_several_chunks_keep_each_conversation_in_the_chunk_that_caches_it(tiny):
    """Chunks of 2 rows over 6 conversations; the second call continues 4 of them (the 2nd and 5th ended). Each goes
    to the chunk that caches it, so the call feeds only each one's new tokens: the last token of its reply (never
    fed while decoding) and the message after it. Every sampled token's log-prob is a fresh forward pass's."""
    from rllib_ragen.objectives import token_logprobs

    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, max_batch_size=2)
    params = SamplingParams(max_new_tokens=6, stop_strings=())
    prompts = [tokenizer.encode(f"conversation {i}: " + "word " * (3 + i)) for i in range(6)]
    first = backend.generate(prompts, params, seed=1)
    message = tokenizer.encode(" next")
    kept = [0, 2, 3, 5]
    follow = [prompts[i] + first[i].token_ids + message for i in kept]
    before = backend.stats["prefilled_tokens"]
    second = backend.generate(follow, params, seed=2)
    assert backend.stats["prefilled_tokens"] - before == len(kept) * (1 + len(message))
    for prompt, generation in zip(follow, second):
        ids = torch.tensor([prompt + generation.token_ids])
        with torch.no_grad():
            fresh = token_logprobs(model(input_ids=ids).logits, ids)[0, len(prompt) :]
        assert torch.allclose(fresh, torch.tensor(generation.logprobs), atol=1e-5)


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
        logits = other(input_ids=ids).logits[0, len(follow_up) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(follow_up) :, None]).squeeze(-1)
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


def test_a_draw_follows_the_probabilities_and_never_picks_an_impossible_token(monkeypatch):
    from scipy.stats import chisquare

    probs = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(_draw(probs.repeat(20000, 1), generator), minlength=5)
    assert counts[1] == counts[4] == 0
    # Against the expected 10000 / 6000 / 4000: a draw off by one token would give p far below 1e-6.
    assert chisquare(counts[[0, 2, 3]].numpy(), [10000, 6000, 4000]).pvalue > 1e-3
    # A uniform number whose product with the total rounds up to it still lands on the last possible token, not on
    # the impossible ones after it.
    monkeypatch.setattr(torch, "rand", lambda *shape, **kwargs: torch.ones(*shape, dtype=kwargs.get("dtype")))
    assert _draw(torch.tensor([[0.25, 0.75, 0.0, 0.0]]), generator).tolist() == [1]


def test_the_growing_cache_layer_holds_what_hugging_faces_layer_holds():
    from transformers.cache_utils import DynamicLayer

    from rllib_ragen.rollout.kv_cache import growing_kv_layer

    ours, theirs = growing_kv_layer()(), DynamicLayer()
    generator = torch.Generator().manual_seed(0)
    # A prefill (a buffer of 200 slots), decode steps past it, a row selection, a crop and a repeat.
    steps = [
        ("update", 100),
        *[("update", 1)] * 120,
        ("select", [2, 0]),
        ("update", 3),
        ("crop", -5),
        ("update", 1),
        ("repeat", 2),
        ("update", 2),
    ]
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
    assert ours._keys.shape[-2] == 228  # the prefill's 100 and 128 more slots: room for every step after it
    # Grown past it: what is needed and half as much again, at least 128 slots more.
    ours.update(*(torch.randn(batch, 2, 10, 4, generator=generator) for _ in range(2)))
    assert ours.get_seq_length() == 231 and ours._keys.shape[-2] == 231 + 128


def test_selecting_rows_copies_the_filled_part_and_a_turns_room_or_nothing():
    from rllib_ragen.rollout.kv_cache import GROWTH_SLOTS, growing_kv_layer

    layer = growing_kv_layer()()
    k, v = torch.randn(3, 2, 300, 4), torch.randn(3, 2, 300, 4)
    layer.update(k, v)
    assert layer._keys.shape[-2] == 300 + 150  # grown to 1.5 times what it holds
    buffer = layer._keys
    layer.batch_select_indices(torch.arange(3))
    assert layer._keys is buffer  # the same rows in order: no copy
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert layer._keys.shape == (2, 2, 300 + GROWTH_SLOTS, 4)
    assert torch.equal(layer.keys, k[[2, 0]]) and torch.equal(layer.values, v[[2, 0]])


def test_a_decode_step_may_read_the_whole_buffer_whose_empty_slots_hold_zeros():
    from rllib_ragen.rollout.kv_cache import growing_kv_layer

    layer = growing_kv_layer()()
    layer.whole_buffer_for_decode = True
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    prefilled = layer.update(k, v)
    assert prefilled[0].shape[-2] == 5  # a prefill gets the filled part, as Hugging Face's layer gives it
    step = torch.randn(2, 3, 1, 4)
    keys, values = layer.update(step, step)
    assert keys.shape[-2] == 5 + 128 and keys.is_contiguous()
    assert torch.equal(keys[..., :6, :], torch.cat([k, step], -2)) and not keys[..., 6:, :].any()


def test_a_buffer_read_whole_is_sized_to_its_call_and_never_grows_within_it():
    from rllib_ragen.rollout.kv_cache import GROWTH_SLOTS, growing_kv_layer

    layer = growing_kv_layer()()
    layer.whole_buffer_for_decode = True
    generator = torch.Generator().manual_seed(0)
    held = []

    def feed(tokens):
        k, v = (torch.randn(2, 3, tokens, 4, generator=generator) for _ in range(2))
        held.append(k)
        return layer.update(k, v)

    layer.reserve(5 + 3)  # a prompt of 5 and 3 decode steps
    feed(5)
    buffer = layer._keys
    assert buffer.shape[-2] == 8  # not 5 + 128: each decode step reads every slot
    for _ in range(3):
        keys, _ = feed(1)
    assert layer._keys is buffer and keys.shape[-2] == 8
    # The next call: 4 new prompt tokens and 3 decode steps after the 8 held, rows reordered (a copy, sized to it).
    layer.reserve(4 + 3)
    layer.batch_select_indices(torch.tensor([1, 0]))
    assert layer._keys.shape[-2] == 15
    buffer = layer._keys
    feed(4)
    assert layer._keys is buffer
    assert torch.equal(layer.keys, torch.cat([torch.cat(held[:4], -2)[[1, 0]], held[4]], -2))
    assert not layer._keys[..., 12:, :].any()  # the slots still empty hold zeros
    # Written past its reservation, a layer grows by half again, and a copy of its rows keeps everything it holds.
    layer.reserve(1)
    feed(4)
    assert layer._keys.shape[-2] == 16 + 128
    layer.batch_select_indices(torch.tensor([1, 0]))
    assert torch.equal(layer.keys, torch.cat([torch.cat(held[:4], -2)[[1, 0]], held[4], held[5]], -2)[[1, 0]])
    # A layer whose decode reads only the filled part keeps the half-again growth: reserve changes nothing there.
    viewed = growing_kv_layer()()
    viewed.reserve(8)
    viewed.update(torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4))
    assert viewed._keys.shape[-2] == 5 + GROWTH_SLOTS


def test_the_backend_sizes_a_bfloat16_cache_to_each_call(tiny):
    """Through HFBackend on the CPU in bfloat16 (the decode that reads the whole buffer): every layer's buffer ends
    a multi-turn rollout exactly as long as its last call needed, and every call's decode steps wrote in place."""
    from rllib_ragen.rollout.models import cast_weights

    model, tokenizer = tiny
    backend = HFBackend(cast_weights(copy.deepcopy(model), torch.bfloat16), tokenizer)
    assert backend._whole_buffer
    grown, calls = [], []
    generate = backend.generate

    def generate_and_look(*args, **kwargs):
        out = generate(*args, **kwargs)
        calls.append(
            [(layer._keys.shape[-2], layer._call_end) for c in backend._caches.values() for layer in c.cache.layers]
        )
        return out

    engine = RolloutEngine(RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3), backend, tokenizer)
    with (
        patch.object(kv_cache, "_grown", side_effect=lambda *a: grown.append(a[-1]) or _grown(*a)),
        patch.object(backend, "generate", generate_and_look),
    ):
        trajectories, _ = engine.rollout([1, 2], 2, SamplingParams(max_new_tokens=12, stop_strings=()), sample_seed=3)
    assert len(calls) == 3 and max(len(t.turn_spans) for t in trajectories) == 3
    assert all(layers and all(capacity == end for capacity, end in layers) for layers in calls)
    # Per layer, keys and values: one allocation a call (its prefill's, or its rows' copy), none per decode step.
    layers = len(calls[0])
    assert len(grown) <= 2 * layers * len(calls)


BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}  # bfloat16 keeps 8 bits of mantissa; the products round apart


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("additive", [False, True])
def test_decode_attention_over_the_whole_buffer_is_sdpas_over_the_filled_part(dtype, additive):
    from rllib_ragen.rollout.kv_cache import _decode_attention, slot_bias

    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, dim, filled, slots = 3, 6, 2, 8, 5, 9
    query = torch.randn(batch, heads, 1, dim, generator=generator).to(dtype)
    keys, values = (torch.randn(batch, kv_heads, slots, dim, generator=generator).to(dtype) for _ in range(2))
    keys[..., filled:, :] = values[..., filled:, :] = 0  # the empty slots
    attend = torch.ones(batch, 1, 1, filled, dtype=torch.bool)
    attend[0, ..., :2] = False  # a left-padded row
    attend[2, ..., 3] = False  # a hole: a row that had stopped
    mask = torch.zeros(attend.shape).masked_fill(~attend, float("-inf")) if additive else attend
    got, _ = _decode_attention(None, query, keys, values, mask, scaling=0.3)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.float(),
        keys[..., :filled, :].float().repeat_interleave(heads // kv_heads, 1),
        values[..., :filled, :].float().repeat_interleave(heads // kv_heads, 1),
        attn_mask=attend,
        scale=0.3,
    )
    assert got.shape == (batch, 1, heads, dim)
    torch.testing.assert_close(got.float(), expected.transpose(1, 2), **({} if dtype == torch.float32 else BF16_TOL))
    # Every layer of a pass gets the same mask: its bias is built once; a new mask (the next step's) gets its own.
    bias = slot_bias(mask, slots)
    assert slot_bias(mask, slots) is bias
    assert torch.equal(bias[0, 0, 0], torch.tensor([float("-inf")] * 2 + [0.0] * 3 + [float("-inf")] * 4))
    assert slot_bias(mask.clone(), slots) is not bias


def test_rollouts_are_the_same_with_hugging_faces_own_cache(tiny, monkeypatch):
    from transformers import DynamicCache

    import rllib_ragen.rollout.backends as backends

    ours, _ = _play(tiny, True)
    monkeypatch.setattr(backends, "new_cache", lambda model, *_: DynamicCache(config=model.config))
    theirs, _ = _play(tiny, True)
    assert [t.token_ids for t in ours] == [t.token_ids for t in theirs]
    assert [t.behaviour_logprobs for t in ours] == [t.behaviour_logprobs for t in theirs]  # bit for bit


def test_only_plain_full_attention_layers_are_swapped_for_growing_ones(tiny):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.cache_utils import DynamicLayer

    from rllib_ragen.rollout.kv_cache import growing_kv_layer, new_cache

    model, tokenizer = tiny
    assert all(type(layer) is growing_kv_layer() for layer in new_cache(model).layers)
    sliding = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            use_sliding_window=True,
            sliding_window=64,
            max_window_layers=0,
        )
    )
    layers = new_cache(sliding).layers  # Hugging Face's sliding-window layers, kept as they are
    assert layers and not any(type(layer) in (DynamicLayer, growing_kv_layer()) for layer in layers)


def test_a_rollouts_kv_caches_go_when_its_conversations_end_and_nothing_played_changes(tiny, monkeypatch):
    """The engine tells the backend when a wave (here two waves of one group of 2) and the rollout end: the caches go
    then, not at the next weight sync (a SmolLM2 rollout's gigabyte stayed resident through the update, and beside
    the next wave's). Every token and log-prob is what the rollout played with the caches kept."""
    import weakref

    model, tokenizer = tiny
    config = RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3, max_concurrent_episodes=2)
    params = SamplingParams(max_new_tokens=20, stop_strings=("e",))
    dropped = HFBackend(model, tokenizer)
    caches_seen = []
    generate = dropped.generate

    def watched(*args, **kwargs):  # each call's caches, watched without keeping them alive
        out = generate(*args, **kwargs)
        caches_seen.extend(weakref.ref(cached.cache) for cached in dropped._caches.values())
        return out

    monkeypatch.setattr(dropped, "generate", watched)
    played, _ = RolloutEngine(config, dropped, tokenizer).rollout([1, 2], 2, params, sample_seed=7)
    assert caches_seen and dropped._caches == {} and all(ref() is None for ref in caches_seen)
    kept = HFBackend(model, tokenizer)
    monkeypatch.setattr(kept, "conversations_ended", lambda: None)
    replayed, _ = RolloutEngine(config, kept, tokenizer).rollout([1, 2], 2, params, sample_seed=7)
    assert kept._caches  # the last wave's caches, kept as before
    assert [t.token_ids for t in played] == [t.token_ids for t in replayed]
    assert [t.behaviour_logprobs for t in played] == [t.behaviour_logprobs for t in replayed]
