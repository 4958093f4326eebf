"""forward_sharing_prefix: reading the prefix all rows share once must give the plain forward pass's logits, loss and
gradients (float rounding aside), and fall back to that pass where sharing does not apply."""

import pytest
import torch

from rllib_ragen.objectives import token_logprobs
from rllib_ragen.rollout import RolloutConfig
from rllib_ragen.rollout.trajectory import pad_trajectories
from rllib_ragen.rollout.models import (
    SHARED_PREFIX_MIN_TOKENS,
    common_prefix_length,
    forward_sharing_prefix,
    load_policy,
    prefix_read_once,
)
from rllib_ragen.rollout.tiny_model import build_tiny_model
from rllib_ragen.demonstrators import sokoban_solver_policy
from rllib_ragen.warm_start import collect_demonstrations


@pytest.fixture(scope="module")
def sokoban_batch():
    torch.set_num_threads(1)
    model, tokenizer = load_policy("tiny", seed=0)
    demos = collect_demonstrations(
        RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=3), sokoban_solver_policy(1), tokenizer, 6
    )
    batch = pad_trajectories(demos, tokenizer.pad_token_id)
    return tokenizer, {key: torch.from_numpy(batch[key]) for key in ("input_ids", "attention_mask", "response_mask")}


def _loss_and_gradients(model, logits_fn, batch):
    model.zero_grad()
    logits = logits_fn()
    mask = batch["response_mask"]
    loss = -(token_logprobs(logits, batch["input_ids"]) * mask).sum() / mask.sum()
    loss.backward()
    return logits.detach(), loss.detach(), [p.grad.clone() for p in model.parameters()]


def _trunk_calls(model):
    """A list that records the (rows, tokens) of every call of ``model``'s trunk, and the hook to remove."""
    calls = []
    hook = model.model.register_forward_pre_hook(
        lambda _, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return calls, hook


def test_common_prefix_length_by_hand():
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 7, 9, 9], [5, 6, 1, 1, 1]])
    assert common_prefix_length(ids, torch.ones_like(ids)) == 2
    # The shortest row (3 real tokens) must keep one token after the prefix, even where all rows agree further.
    same = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    assert common_prefix_length(same, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])) == 2
    assert common_prefix_length(torch.tensor([[1, 2], [3, 2]]), torch.ones(2, 2)) == 0


def test_sharing_the_prefix_gives_the_plain_passs_logits_loss_and_gradients(sokoban_batch):
    tokenizer, batch = sokoban_batch
    assert common_prefix_length(batch["input_ids"], batch["attention_mask"]) > 100  # system prompt + instructions
    model = build_tiny_model(tokenizer, seed=0).train()
    ids, attention, real = batch["input_ids"], batch["attention_mask"], batch["attention_mask"].bool()
    plain = _loss_and_gradients(model, lambda: model(input_ids=ids, attention_mask=attention).logits, batch)
    calls, hook = _trunk_calls(model)
    shared = _loss_and_gradients(model, lambda: forward_sharing_prefix(model, ids, attention)["logits"], batch)
    hook.remove()
    prefix = common_prefix_length(ids, attention)
    assert calls == [(1, prefix), (len(ids), ids.shape[1] - prefix)]  # the prefix as one row, then the rest
    torch.testing.assert_close(shared[0][real], plain[0][real], rtol=0, atol=1e-5)
    torch.testing.assert_close(shared[1], plain[1], rtol=1e-6, atol=0)
    for got, expected in zip(shared[2], plain[2]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)


def test_without_a_long_enough_shared_prefix_it_is_the_plain_pass(sokoban_batch):
    tokenizer, batch = sokoban_batch
    model = build_tiny_model(tokenizer, seed=0)
    ids, attention = batch["input_ids"].clone(), batch["attention_mask"]
    ids[1, SHARED_PREFIX_MIN_TOKENS - 1] = tokenizer.pad_token_id  # row 1 parts from the others one token early
    with torch.no_grad():
        for rows in (slice(0, 1), slice(None)):  # a single row; rows sharing too little
            expected = model(input_ids=ids[rows], attention_mask=attention[rows]).logits
            assert torch.equal(forward_sharing_prefix(model, ids[rows], attention[rows])["logits"], expected)


def test_a_sliding_window_model_takes_the_plain_pass(sokoban_batch):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer, batch = sokoban_batch
    config = Qwen2Config(
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
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        expected = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        shared = forward_sharing_prefix(model, batch["input_ids"], batch["attention_mask"])
        assert torch.equal(shared["logits"], expected)


def test_hidden_states_and_a_bare_trunk_come_out_as_from_the_plain_pass(sokoban_batch):
    tokenizer, batch = sokoban_batch
    model = build_tiny_model(tokenizer, seed=0)
    ids, attention, real = batch["input_ids"], batch["attention_mask"], batch["attention_mask"].bool()
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
        shared = forward_sharing_prefix(model, ids, attention, output_hidden_states=True)
        assert len(shared["hidden_states"]) == len(plain.hidden_states) == model.config.num_hidden_layers + 1
        for got, expected in zip(shared["hidden_states"], plain.hidden_states):
            torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)
        trunk = forward_sharing_prefix(model.model, ids, attention)  # the critic's trunk: no logits
        assert set(trunk) == {"last_hidden_state"}
        torch.testing.assert_close(trunk["last_hidden_state"][real], plain.hidden_states[-1][real], rtol=0, atol=1e-5)


def _saved_bytes_and_gradients(model, ids, attention, mask):
    """The bytes autograd keeps for the backward pass of the shared-prefix loss, and the gradients it gives."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = forward_sharing_prefix(model, ids, attention)["logits"]
    loss = -(token_logprobs(logits, ids) * mask).sum() / mask.sum()
    loss.backward()
    return sum(saved), [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("lora", [False, True])
def test_activation_checkpointing_keeps_the_shared_prefix_and_every_gradient_bit(sokoban_batch, lora):
    from rllib_ragen.rollout.lora import attach_lora, lora_settings
    from rllib_ragen.rollout.models import checkpointed_layers, enable_activation_checkpointing

    tokenizer, batch = sokoban_batch
    ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]

    def model():
        policy = build_tiny_model(tokenizer, seed=0)
        return (attach_lora(policy, lora_settings({"r": 4})) if lora else policy).train()

    plain = model()
    kept, expected = _saved_bytes_and_gradients(plain, ids, attention, mask)
    checkpointed = model()
    enable_activation_checkpointing(checkpointed)
    layers = checkpointed_layers(checkpointed)
    assert len(layers) == checkpointed.config.num_hidden_layers and checkpointed_layers(plain) == []
    calls = []  # the first layer's MLP: Hugging Face re-runs a layer's forward, not its hooks
    hook = layers[0].mlp.register_forward_pre_hook(lambda _, args: calls.append(tuple(args[0].shape[:2])))
    kept_checkpointed, got = _saved_bytes_and_gradients(checkpointed, ids, attention, mask)
    hook.remove()
    prefix = common_prefix_length(ids, attention)
    # The prefix once (not re-run), the rows' pass, and the rows' pass again in the backward pass.
    assert calls == [(1, prefix), *[(len(ids), ids.shape[1] - prefix)] * 2]
    assert kept_checkpointed < kept / 2
    assert len(got) == len(expected) == sum(p.requires_grad for p in plain.parameters())
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    # The flags the pass set for its duration are the layers' own again.
    assert all(layer.gradient_checkpointing and "_can_checkpoint_with_cache" not in vars(layer) for layer in layers)


def _micro_batch_gradients(model, batch, micro_size: int, before_exit: list | None = None):
    """The whole batch's mean reply-token loss, accumulated over micro-batches of ``micro_size`` rows that read
    their common prefix once (``prefix_read_once``); the logits of every pass; the gradients after the block (and,
    into ``before_exit``, those before the prefix's share was added)."""
    ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    model.zero_grad()
    logits = []
    with prefix_read_once(ids, attention) as prefix:
        for start in range(0, len(ids), micro_size):
            rows = slice(start, start + micro_size)
            part = forward_sharing_prefix(model, ids[rows], attention[rows], prefix=prefix)["logits"]
            (-(token_logprobs(part, ids[rows]) * mask[rows]).sum() / mask.sum()).backward()
            logits.append(part.detach())
        if before_exit is not None:
            before_exit.extend(p.grad.clone() for p in model.parameters() if p.requires_grad)
    return torch.cat(logits), [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("micro_size", [1, 2])
def test_micro_batches_read_their_common_prefix_once_with_the_plain_passs_gradients(sokoban_batch, micro_size):
    tokenizer, batch = sokoban_batch
    model = build_tiny_model(tokenizer, seed=0).train()
    ids, attention, real = batch["input_ids"], batch["attention_mask"], batch["attention_mask"].bool()
    plain = _loss_and_gradients(model, lambda: model(input_ids=ids, attention_mask=attention).logits, batch)
    calls, hook = _trunk_calls(model)
    before_exit = []
    logits, gradients = _micro_batch_gradients(model, batch, micro_size, before_exit)
    hook.remove()
    prefix = common_prefix_length(ids, attention)
    passes = [(len(ids[k : k + micro_size]), ids.shape[1] - prefix) for k in range(0, len(ids), micro_size)]
    assert calls == [(1, prefix), *passes]  # the prefix once for every pass, then each pass's rest
    torch.testing.assert_close(logits[real], plain[0][real], rtol=0, atol=1e-5)
    for got, expected in zip(gradients, plain[2]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)
    # Before the block ends, the prefix's share is missing: the embeddings of its tokens have no gradient yet.
    prefix_tokens = ids[0, :prefix].unique()
    assert before_exit[0][prefix_tokens].abs().sum() < gradients[0][prefix_tokens].abs().sum()


def test_a_prefix_read_without_gradients_is_not_reused_by_a_pass_with_them(sokoban_batch):
    tokenizer, batch = sokoban_batch
    model = build_tiny_model(tokenizer, seed=0).train()
    ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    plain = _loss_and_gradients(model, lambda: model(input_ids=ids, attention_mask=attention).logits, batch)
    model.zero_grad()
    with prefix_read_once(ids, attention) as prefix:
        with torch.no_grad():  # a scoring pass reads the prefix first, without a graph
            forward_sharing_prefix(model, ids[:2], attention[:2], prefix=prefix)
        logits = forward_sharing_prefix(model, ids, attention, prefix=prefix)["logits"]
        (-(token_logprobs(logits, ids) * mask).sum() / mask.sum()).backward()
    for got, expected in zip([p.grad for p in model.parameters()], plain[2]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("lora", [False, True])
def test_micro_batches_reading_the_prefix_once_keep_their_gradients_under_checkpointing(sokoban_batch, lora):
    from rllib_ragen.rollout.lora import attach_lora, lora_settings
    from rllib_ragen.rollout.models import enable_activation_checkpointing

    tokenizer, batch = sokoban_batch

    def model():
        policy = build_tiny_model(tokenizer, seed=0)
        return (attach_lora(policy, lora_settings({"r": 4})) if lora else policy).train()

    expected = _micro_batch_gradients(model(), batch, 2)[1]
    checkpointed = model()
    enable_activation_checkpointing(checkpointed)
    got = _micro_batch_gradients(checkpointed, batch, 2)[1]
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
