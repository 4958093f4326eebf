"""The static-KV-cache decode path (``static_decode.py``), run eagerly on the CPU: every recorded log-prob equals a
fresh forward pass over the token ids, through turns (prefix reuse, rows reordered and parked), slabs that no longer
fit, and several chunks. On a GPU the same path replays each decode step as a CUDA graph (tests/test_gpu.py)."""

import pytest
import torch

from rllib_ragen.rollout.backends import HFBackend, SamplingParams
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.models import load_policy
from rllib_ragen.rollout.static_decode import COLUMN_BUCKET, StaticSlab


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_policy("tiny", seed=0)


def _fresh_logprobs(model, prompt, reply, temperature=1.0):
    ids = torch.tensor([list(prompt) + list(reply)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)


def _assert_exact(model, prompts, generations, temperature=1.0):
    for prompt, generation in zip(prompts, generations):
        assert generation.token_ids
        torch.testing.assert_close(
            torch.tensor(generation.logprobs),
            _fresh_logprobs(model, prompt, generation.token_ids, temperature),
            atol=1e-5,
            rtol=0,
        )


def _play(tiny, decode, **backend_kwargs):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, decode=decode, **backend_kwargs)
    engine = RolloutEngine(RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3), backend, tokenizer)
    # A stop string the random model hits often, so rows stop at different steps and leave holes.
    params = SamplingParams(temperature=0.8, max_new_tokens=20, stop_strings=("e",))
    trajectories, _ = engine.rollout([1, 2, 3], 2, params, sample_seed=7)
    return trajectories, backend


def test_a_multi_turn_rollout_on_the_static_cache_records_exact_logprobs(tiny):
    model, _ = tiny
    trajectories, backend = _play(tiny, "static")
    assert backend.decode == "static" and not backend.cuda_graphs  # on the CPU: the same path, eagerly
    for t in trajectories:
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()[0, :-1] / 0.8
        fresh = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        mask = torch.tensor(t.response_mask[1:], dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(t.behaviour_logprobs[1:])[mask], fresh[mask], atol=1e-5, rtol=0)
    assert max(t.num_turns for t in trajectories) > 1
    assert backend.stats["prefilled_tokens"] < 0.5 * backend.stats["prompt_tokens"]  # later turns reuse the cache


def test_static_and_growing_caches_sample_the_same_replies(tiny):
    static, _ = _play(tiny, "static")
    growing, _ = _play(tiny, "growing")
    assert [t.token_ids for t in static] == [t.token_ids for t in growing]
    for a, b in zip(static, growing):
        torch.testing.assert_close(
            torch.tensor(a.behaviour_logprobs), torch.tensor(b.behaviour_logprobs), atol=1e-5, rtol=0
        )


def test_the_next_call_may_take_a_subset_of_rows_in_another_order(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, decode="static")
    params = SamplingParams(max_new_tokens=6, stop_strings=())
    prompts = [tokenizer(f"<|im_start|>user\nTurn 1. State {n}:\n#P_O#<|im_end|>\n")["input_ids"] for n in range(3)]
    first = backend.generate(prompts, params, seed=0)
    slab = backend._caches[0].cache
    follow = [prompts[2] + first[2].token_ids + prompts[0], prompts[0] + first[0].token_ids]
    second = backend.generate(follow, params, seed=1)
    assert backend._caches[0].cache is slab  # reordered and parked in place, not prefilled again
    assert backend.stats["prefilled_tokens"] < backend.stats["prompt_tokens"]
    _assert_exact(model, follow, second)


def test_a_call_that_no_longer_fits_the_slab_gets_a_new_one(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, decode="static")
    params = SamplingParams(max_new_tokens=4, stop_strings=())
    prompt = tokenizer("<|im_start|>user\nGo<|im_end|>\n")["input_ids"]
    first = backend.generate([prompt], params, seed=0)[0]
    slab = backend._caches[0].cache
    assert slab.columns == COLUMN_BUCKET  # twice what the call needs, rounded up
    long = prompt + first.token_ids + tokenizer("word " * COLUMN_BUCKET)["input_ids"]
    second = backend.generate([long], params, seed=1)
    assert backend._caches[0].cache is not slab and backend._caches[0].cache.columns > COLUMN_BUCKET
    _assert_exact(model, [long], second)


def test_each_chunk_keeps_its_own_slab(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, decode="static", max_batch_size=2)
    params = SamplingParams(max_new_tokens=5, stop_strings=())
    prompts = [tokenizer(f"<|im_start|>user\nState {n}<|im_end|>\n")["input_ids"] for n in range(4)]
    first = backend.generate(prompts, params, seed=0)
    assert backend._caches[0].cache is not backend._caches[1].cache
    follow = [p + g.token_ids + p for p, g in zip(prompts, first)]
    _assert_exact(model, follow, backend.generate(follow, params, seed=1))


def test_the_slab_writes_each_row_only_where_it_has_tokens(tiny):
    model, _ = tiny
    slab = StaticSlab(model, rows=2, columns=16, cuda_graphs=False)
    slab.feed([[5, 6, 7], [8]], pad_token_id=0)
    slab.feed([[9], []], pad_token_id=0)
    assert slab.column == 4
    assert slab.valid.tolist() == [[True] * 4 + [False] * 12, [False, False, True, False] + [False] * 12]


def test_auto_chooses_by_device_and_static_refuses_models_it_cannot_hold(tiny):
    model, tokenizer = tiny
    assert HFBackend(model, tokenizer).decode == "growing"  # a CPU model
    with pytest.raises(ValueError, match="decode="):
        HFBackend(model, tokenizer, decode="fast")
