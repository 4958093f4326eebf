"""LoRA with peft: only adapters train and are checkpointed, env runners sample from the merged policy with the
learner's log-probs, resume is exact, the export is a plain model, and vLLM engines receive the adapter."""

import importlib.util
import pickle

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_ragen import StarPO
from rllib_ragen.rollout.lora import adapter_files, attach_lora, lora_settings, merged_policy_state, write_adapter
from rllib_ragen.rollout.models import load_policy

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def lora_config(small_config, **training):
    config = small_config(validation_interval=0, **training)
    return config.rl_module(model_config={"model": "tiny", "lora": LORA})


def learner_module(algo):
    return algo.learner_group._learner.module[DEFAULT_MODULE_ID]


def sequence_logprobs(model, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def test_merged_weights_are_the_base_plus_scaled_b_times_a():
    policy, _ = load_policy("tiny")
    base_q = policy.model.layers[0].self_attn.q_proj.weight.detach().clone()
    wrapped = attach_lora(policy, lora_settings(LORA), seed=3)
    layer = wrapped.get_base_model().model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_(
            torch.arange(layer.lora_B["default"].weight.numel(), dtype=torch.float32).reshape(
                layer.lora_B["default"].weight.shape
            )
            / 1000
        )
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    merged = merged_policy_state(wrapped)
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], base_q + (8 / 4) * b @ a, atol=1e-6)
    assert torch.equal(
        merged["model.layers.0.self_attn.k_proj.weight"],  # not a target: the base, untouched
        wrapped.get_base_model().model.layers[0].self_attn.k_proj.weight,
    )
    assert not any(".lora_" in key or "base_layer" in key for key in merged)
    # The merged state is a plain Hugging Face state: the base model class loads it strictly and agrees.
    plain, _ = load_policy("tiny")
    plain.load_state_dict(merged)
    ids = torch.tensor([[5, 17, 40, 99, 3]])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, wrapped(input_ids=ids).logits, atol=1e-5)


def test_lora_settings_are_checked_by_name_at_validate(small_config):
    for lora, words in (
        ({"rank": 8}, "unknown keys ['rank']"),
        ({"r": 0}, "r >= 1"),
        ({"r": 8, "dropout": 0.1}, "dropout is fixed at 0"),
        ({"alpha": "16"}, "['alpha']"),
        ({"alpha": float("inf")}, "a finite alpha > 0"),
    ):
        config = small_config().rl_module(model_config={"model": "tiny", "lora": lora})
        with pytest.raises(ValueError, match="model_config\\['lora'\\]") as error:
            config.validate()
        assert words in str(error.value)


@pytest.mark.usefixtures("ray_session")
def test_lora_trains_adapters_only_and_resumes_exactly(tmp_path, small_config):
    algo = lora_config(small_config, num_epochs=2, updates_per_rollout_batch=2).build_algo()
    try:
        module = learner_module(algo)
        base_before = {
            k: v.clone() for k, v in module.policy.get_base_model().state_dict().items() if ".lora_" not in k
        }
        adapters = {n for n, p in module.policy.named_parameters() if p.requires_grad}
        assert adapters and all(".lora_" in n for n in adapters)
        actor = algo.learner_group._learner.get_optimizers_for_module(DEFAULT_MODULE_ID)
        actor_params = dict(actor)["actor"].param_groups[0]["params"]
        assert sum(p.numel() for p in actor_params) == sum(
            p.numel() for p in module.policy.parameters() if p.requires_grad
        )
        assert all(p.requires_grad for p in module.critic.parameters())  # the critic keeps its own full weights

        first = algo.train()["learners"][DEFAULT_MODULE_ID]
        assert first["actor/first_step_logprob_deviation"] == 0.0
        assert first["rollout/logprob_gap_max"] < 1e-5  # merged weights on the runner, adapters on the learner
        checkpoint = algo.save_to_path(tmp_path / "checkpoint")
        after = module.policy.get_base_model().state_dict()
        for key, value in base_before.items():  # frozen base weights
            assert torch.equal(after[key], value), key
        assert any(
            not torch.equal(p, torch.zeros_like(p)) for n, p in module.policy.named_parameters() if "lora_B" in n
        )  # the adapters moved away from their zero start
        second = algo.train()["learners"][DEFAULT_MODULE_ID]
        assert second["rollout/logprob_gap_max"] < 1e-5  # after a sync of adapted weights, too
        expected = {k: v.clone() for k, v in module.get_state().items()}
        # The env runner samples from the learner's policy with the adapters merged in.
        runner_policy = algo.env_runner.module.policy.state_dict()
        for key, value in merged_policy_state(module.policy).items():
            assert torch.equal(runner_policy[key], value), key
    finally:
        algo.stop()

    # The checkpoint holds adapters and critic (and their optimizer state): the frozen base is never written.
    with open(tmp_path / "checkpoint/learner_group/learner/rl_module/default_policy/module_state.pkl", "rb") as f:
        saved = pickle.load(f)
    assert {k for k in saved if k.startswith("policy.")} == {k for k in expected if k.startswith("policy.")}
    assert all(".lora_" in k for k in saved if k.startswith("policy."))

    resumed = StarPO.from_checkpoint(checkpoint)
    try:
        assert resumed.train()["learners"][DEFAULT_MODULE_ID]["actor/pg_loss"] == second["actor/pg_loss"]
        state = learner_module(resumed).get_state()
    finally:
        resumed.stop()
    assert state.keys() == expected.keys()
    for key in state:  # adapters and critic, bit for bit
        assert torch.equal(state[key], expected[key]), key


@pytest.mark.usefixtures("ray_session")
def test_lora_export_is_a_plain_merged_model_and_the_adapter_files_load_in_peft(tmp_path, small_config):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    algo = lora_config(small_config, kl_coeff=0.01).build_algo()
    try:
        assert algo.learner_group._learner._reference is None  # the base (adapters off) is the KL reference
        result = algo.train()["learners"][DEFAULT_MODULE_ID]
        assert result["actor/kl_to_reference"] == 0.0  # B = 0: the policy starts as its base
        assert algo.train()["learners"][DEFAULT_MODULE_ID]["actor/kl_to_reference"] > 0.0
        algo.export_pretrained(tmp_path / "policy")
        policy = learner_module(algo).policy
        ids = algo.last_rollout[0].token_ids
        exported = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
        assert not any("lora" in name for name, _ in exported.named_parameters())
        assert torch.allclose(sequence_logprobs(exported, ids), sequence_logprobs(policy, ids), atol=1e-5)

        # What vLLM engines receive, written as peft writes it, loads back onto the base to the same policy.
        config, tensors = adapter_files(learner_module(algo).adapter_state(), lora_settings(LORA), "tiny")
        assert config["target_modules"] == sorted(LORA["target_modules"])
        write_adapter(tmp_path / "adapter", config, tensors)
        base, _ = load_policy("tiny")
        reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter")
        assert torch.allclose(sequence_logprobs(reloaded, ids), sequence_logprobs(policy, ids), atol=1e-5)
        adapter_bytes = sum(v.numel() * v.element_size() for v in tensors.values())
        merged_bytes = sum(v.numel() * v.element_size() for v in merged_policy_state(policy).values())
        assert adapter_bytes * 20 < merged_bytes  # why engines get the adapter: a small fraction to send
    finally:
        algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_a_lora_checkpoint_does_not_load_into_a_full_model_algorithm(tmp_path, small_config):
    algo = lora_config(small_config).build_algo()
    try:
        checkpoint = algo.save_to_path(tmp_path / "checkpoint")
    finally:
        algo.stop()
    full = small_config(validation_interval=0).build_algo()
    try:
        with pytest.raises(ValueError, match="model_config\\['lora'\\]: checkpoint"):
            full.restore_from_path(checkpoint)
    finally:
        full.stop()


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_vllm_engines_serve_the_learners_adapter(small_config):
    config = lora_config(
        small_config,
        inference_backend="vllm",
        lr=1e-2,
        vllm_engine_config={"enforce_eager": True, "max_model_len": 2048},
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["learners"][DEFAULT_MODULE_ID]["rollout/logprob_gap_max"] < 1e-3
        engine = algo.engine_actors.clients[0]
        assert engine.get_stats()["weight_loads"] == 1
        ids = algo.last_rollout[0].token_ids
        served = torch.tensor(engine.sequence_logprobs(ids))
        policy = learner_module(algo).policy
        assert torch.allclose(served, sequence_logprobs(policy, ids), atol=1e-4)
        with policy.disable_adapter():  # and it is the adapter that makes the difference
            assert not torch.allclose(served, sequence_logprobs(policy, ids), atol=1e-4)
    finally:
        algo.stop()
    assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["actor/pg_loss"])


@pytest.mark.usefixtures("ray_session")
def test_activation_checkpointing_trains_the_same_adapters_and_critic_to_the_bit(small_config):
    from rllib_ragen.rollout.models import checkpointed_layers

    trained = []
    for checkpointing in (False, True):
        config = lora_config(small_config)
        config.rl_module(model_config={**config.model_config, "activation_checkpointing": checkpointing})
        algo = config.build_algo()
        module = learner_module(algo)
        assert bool(checkpointed_layers(module.policy)) is checkpointing
        assert bool(checkpointed_layers(module.critic.trunk)) is checkpointing
        algo.train()
        trained.append({k: v.detach().clone() for k, v in module.state_dict().items()})
        algo.stop()
    plain, checkpointed = trained
    assert plain.keys() == checkpointed.keys()
    assert [k for k in plain if not torch.equal(plain[k], checkpointed[k])] == []
    assert any("lora_B" in k and plain[k].abs().sum() > 0 for k in plain)  # the adapters did move
    with pytest.raises(ValueError, match=r"model_config\['activation_checkpointing'\]='yes': True or False"):
        lora_config(small_config).rl_module(
            model_config={"model": "tiny", "activation_checkpointing": "yes"}
        ).validate()


@pytest.mark.usefixtures("ray_session")
def test_bfloat16_base_weights_train_the_same_adapters_to_the_bit_under_bfloat16_autocast(small_config):
    """``base_dtype="bfloat16"`` stores what autocast would compute with: one iteration (sampled in bfloat16 from
    the same weights, updated under bfloat16 autocast) trains the same adapters and critic to the bit."""
    trained, merged, bases = [], [], []
    for base_dtype in (None, "bfloat16"):
        config = lora_config(small_config, autocast_dtype="bfloat16", rollout_dtype="bfloat16")
        config.rl_module(model_config={**config.model_config, "lora": {**LORA, "base_dtype": base_dtype}})
        algo = config.build_algo()
        module = learner_module(algo)
        q_proj = module.policy.get_base_model().model.layers[0].self_attn.q_proj
        assert q_proj.get_base_layer().weight.dtype == (torch.bfloat16 if base_dtype else torch.float32)
        assert q_proj.lora_A["default"].weight.dtype == torch.float32  # the adapters train in float32
        bases.append(q_proj.get_base_layer().weight.detach().float().clone())
        algo.train()
        trained.append(
            {k: v.detach().clone() for k, v in module.state_dict().items() if ".lora_" in k or k.startswith("critic.")}
        )
        merged.append(merged_policy_state(module.policy))
        algo.stop()
    assert [k for k in trained[0] if not torch.equal(trained[0][k], trained[1][k])] == []
    assert any("lora_B" in k and trained[0][k].abs().sum() > 0 for k in trained[0])  # the adapters did move
    # Merged in the model's float32: the bfloat16 base plus the same float32 delta.
    key = "model.layers.0.self_attn.q_proj.weight"
    assert merged[1][key].dtype == torch.float32
    assert torch.equal(bases[1], bases[0].to(torch.bfloat16).float())
    assert torch.allclose(merged[1][key] - bases[1], merged[0][key] - bases[0], atol=1e-7)


def test_bfloat16_base_weights_need_bfloat16_autocast(small_config):
    config = small_config().rl_module(model_config={"model": "tiny", "lora": {"r": 4, "base_dtype": "bfloat16"}})
    with pytest.raises(
        ValueError,
        match=r"base_dtype'\]='bfloat16' with autocast_dtype=None: .* set "
        r"autocast_dtype='bfloat16'",
    ):
        config.validate()
    config.training(autocast_dtype="bfloat16").validate()
    with pytest.raises(ValueError, match=r"base_dtype'\]='float16': choose one of \['float32', 'bfloat16'\]"):
        config.rl_module(model_config={"model": "tiny", "lora": {"r": 4, "base_dtype": "float16"}}).validate()
