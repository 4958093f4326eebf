"""Limited context windows: what each turn's prompt holds, per-turn samples exact to the token, and the episode's
advantages placed on each turn's own row (every estimator, the critic's on the episode layout)."""

import dataclasses
import random

import pytest
import torch

from rllib_ragen import StarPOConfig
from rllib_ragen.objectives import compute_bi_level_gae, compute_gae, compute_turn_gae
from rllib_ragen.objectives.episode_layout import EpisodeLayout
from rllib_ragen.rollout.backends import HFBackend, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.rollout_config import RolloutConfig
from rllib_ragen.rollout.engine import RolloutEngine
from rllib_ragen.rollout.models import load_policy
from rllib_ragen.demonstrators import sokoban_solver_policy
from rllib_ragen.starpo.batch_advantages import batch_advantages
from rllib_ragen.starpo.update_batch import prepare_update_batch, token_advantages_by_trajectory


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_policy("tiny", seed=0)


def play(tiny, window, turns=None, max_turns=4, **rollout):
    model, tokenizer = tiny
    config = RolloutConfig(
        env="rllib_ragen/Sokoban-v0", max_turns=max_turns, context_window=window, context_window_turns=turns, **rollout
    )
    engine = RolloutEngine(config, HFBackend(model, tokenizer), tokenizer)
    trajectories, metrics = engine.rollout(
        [5, 6], group_size=2, sampling=SamplingParams(max_new_tokens=16), sample_seed=1
    )
    return engine, trajectories, metrics


def _fresh_logprobs(model, token_ids):
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.cat([torch.zeros(1), torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]])


@pytest.mark.parametrize("window, turns", [("last_k_turns", 2), ("single_turn", None)])
def test_each_turn_sample_is_exact_to_the_token(tiny, window, turns):
    model, _ = tiny
    _, trajectories, _ = play(tiny, window, turns)
    assert all(t.num_turns == 4 and len(t.turn_samples) == 4 for t in trajectories)
    for t in trajectories:
        for sample, (start, end) in zip(t.turn_samples, t.turn_spans):
            a, b = sample.reply_span
            # The reply is the record's, id for id, and the only sampled run of the row.
            assert sample.token_ids[a:b] == t.token_ids[start:end]
            assert sample.response_mask == [0] * a + [1] * (b - a) + [0] * (len(sample.token_ids) - b)
            # Its log-probs are those of a fresh forward pass over exactly the tokens the policy read.
            fresh = _fresh_logprobs(model, sample.token_ids)[a:b]
            assert torch.allclose(fresh, torch.tensor(sample.behaviour_logprobs[a:b]), atol=1e-5, rtol=0)


def test_a_window_holds_the_instructions_and_the_last_k_turns(tiny):
    engine, trajectories, _ = play(tiny, "last_k_turns", 2)
    _, full, _ = play(tiny, "full")
    for t, whole in zip(trajectories, full):
        spans = t.turn_spans
        # Turn 1 reads the first prompt, as the full context does.
        assert t.turn_samples[0].token_ids[: spans[0][0]] == whole.token_ids[: whole.turn_spans[0][0]]
        # Turn 2 (k = 2): still the conversation from its start.
        assert t.turn_samples[1].token_ids[: t.turn_samples[1].reply_span[0]] == t.token_ids[: spans[1][0]]
        # Turns 3 and 4: the first prompt rebuilt around the message of the turn before, then that turn's reply
        # as sampled and the current message: the record from the previous reply on.
        for turn in (3, 4):
            sample = t.turn_samples[turn - 1]
            prompt = sample.token_ids[: sample.reply_span[0]]
            tail = t.token_ids[spans[turn - 2][0] : spans[turn - 1][0]]
            assert prompt[len(prompt) - len(tail) :] == tail
            text = engine.tokenizer.decode(prompt)
            assert f"Turn {turn - 1}. State" in text and f"Turn {turn}. State" in text
            assert f"Turn {turn - 2}. State" not in text and text.count("Symbols: #") == 1  # instructions once


def test_single_turn_reads_the_current_state_only(tiny):
    engine, trajectories, _ = play(tiny, "single_turn")
    for t in trajectories:
        lengths = set()
        for turn, sample in enumerate(t.turn_samples, start=1):
            text = engine.tokenizer.decode(sample.token_ids[: sample.reply_span[0]])
            assert (
                f"Turn {turn}. State" in text
                and "<|im_start|>assistant" == text.rstrip()[-len("<|im_start|>assistant") :]
                and text.count("Turn ") == 1
            )
            lengths.add(len(sample.token_ids[: sample.reply_span[0]]))
        assert max(lengths) - min(lengths) < 20  # the prompt does not grow with the episode


def test_the_context_budget_bounds_each_turn_not_the_episode(tiny):
    # 300 tokens hold one turn's prompt and reply, not the conversation of four turns.
    _, full, metrics = play(tiny, "full", max_context_tokens=300)
    assert metrics["rollout/truncated_rate"] == 1.0 and max(t.num_turns for t in full) < 4
    _, windowed, metrics = play(tiny, "single_turn", max_context_tokens=300)
    assert metrics["rollout/truncated_rate"] == 0.0 and {t.num_turns for t in windowed} == {4}
    assert max(len(t.token_ids) for t in windowed) > 300  # the record of the episode is longer
    assert all(len(s.token_ids) <= 300 for t in windowed for s in t.turn_samples)


def _config(estimator, window, **knobs):
    knobs = dict(
        num_groups=4,
        group_size=2,
        rollout_filter="none",
        rollout_filter_ratio=1.0,
        advantage_estimator=estimator,
        **knobs,
    )
    if window != "full":
        knobs.update(context_window=window, context_window_turns=2 if window == "last_k_turns" else None)
    return StarPOConfig().training(**knobs)


@pytest.mark.parametrize("estimator, turn_level", [("grpo", False), ("gigpo", True), ("raw", True), ("brpo", False)])
def test_turn_rows_carry_the_advantages_of_the_whole_episode(tiny, estimator, turn_level):
    _, tokenizer = tiny
    # Each reply is the solver's next move or a seeded random one: returns and turn counts differ.
    solver, draw = sokoban_solver_policy(), random.Random(0)
    policy = lambda prompt: (
        solver(prompt)
        if draw.random() < 0.6
        # noqa: E731
        else (f"<think>try</think><answer>{draw.choice(['Up', 'Left', 'Down', 'Right'])}</answer>")
    )
    config = RolloutConfig(
        env="rllib_ragen/Sokoban-v0",
        max_turns=4,
        max_actions_per_turn=1,
        context_window="last_k_turns",
        context_window_turns=2,
    )
    trajectories, _ = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer).rollout(
        [1, 2, 3, 4], group_size=2, sampling=SamplingParams()
    )
    assert len({t.num_turns for t in trajectories}) > 1 and len({t.total_return for t in trajectories}) > 1
    pad = tokenizer.pad_token_id
    full_config = _config(estimator, "full", turn_level_rewards=turn_level)
    rows_config = _config(estimator, "last_k_turns", turn_level_rewards=turn_level)
    full, _ = prepare_update_batch(trajectories, full_config, pad)
    rows, metrics = prepare_update_batch(trajectories, rows_config, pad)
    assert len(rows["input_ids"]) == sum(t.num_turns for t in trajectories) == metrics["update/rows"]
    assert rows["turn"].tolist() == [k for t in sorted(trajectories, key=lambda t: t.group) for k in range(t.num_turns)]
    # Mapped back onto each conversation, the rows' advantages are the full context's, token for token.
    expected = token_advantages_by_trajectory(full, batch_advantages(full, full_config)[0].numpy(), trajectories)
    got = token_advantages_by_trajectory(rows, batch_advantages(rows, rows_config)[0].numpy(), trajectories)
    assert expected.keys() == got.keys()
    for i in expected:
        assert got[i] == pytest.approx(expected[i], abs=1e-6), i
    # The rewards: with the return, only each episode's last turn holds it, on its reply's last token.
    for row in range(len(rows["turn"])):
        t = trajectories[rows["trajectory"][row]]
        last = rows["turn"][row] == t.num_turns - 1
        if not turn_level:
            assert rows["token_rewards"][row].sum() == pytest.approx(t.total_return if last else 0.0)


def test_episode_layout_gives_the_critics_the_full_contexts_recursion():
    # One episode of three turns in the full context: prompt 0-3, replies at 4-6, 9-10 and 13-15, observations
    # between. As rows: each turn's row holds its own prompt (of another length) and then the same reply.
    torch.manual_seed(0)
    width, replies = 18, [(4, 7), (9, 11), (13, 16)]
    full_mask = torch.zeros(1, width)
    for a, b in replies:
        full_mask[0, a:b] = 1
    values_full = torch.randn(1, width) * full_mask
    rewards_full = torch.zeros(1, width)
    rewards_full[0, 6], rewards_full[0, 10], rewards_full[0, 15] = -0.1, 0.5, 1.0
    prompts = [5, 2, 7]
    rows_mask, rows_values, rows_rewards = torch.zeros(3, 12), torch.zeros(3, 12), torch.zeros(3, 12)
    for k, ((a, b), p) in enumerate(zip(replies, prompts)):
        rows_mask[k, p : p + b - a] = 1
        rows_values[k, p : p + b - a] = values_full[0, a:b]
        rows_rewards[k, p : p + b - a] = rewards_full[0, a:b]
    layout = EpisodeLayout(torch.tensor([7, 7, 7]), torch.tensor([0, 1, 2]), rows_mask)
    assert layout.mask.tolist() == [[1, 1, 1, 0, 1, 1, 0, 1, 1, 1]]  # the replies end to end, one gap between
    for estimator in (
        lambda r, v, m: compute_gae(r, v, m, gamma=0.9, lam=0.8),
        lambda r, v, m: compute_bi_level_gae(r, v, m, gamma_turn=0.9, gamma_token=0.95, lam=0.8),
        lambda r, v, m: compute_turn_gae(r, v, m, gamma=0.9, lam=0.8),
    ):
        expected, expected_returns = estimator(rewards_full, values_full, full_mask)
        advantages, returns = estimator(layout.gather(rows_rewards), layout.gather(rows_values), layout.mask)
        on_rows, returns_on_rows = layout.scatter(advantages), layout.scatter(returns)
        for k, ((a, b), p) in enumerate(zip(replies, prompts)):
            assert torch.allclose(on_rows[k, p : p + b - a], expected[0, a:b], atol=1e-6)
            assert torch.allclose(returns_on_rows[k, p : p + b - a], expected_returns[0, a:b], atol=1e-6)
        assert torch.all(on_rows[rows_mask == 0] == 0)


def test_rollout_config_carries_the_window():
    config = StarPOConfig().training(context_window="last_k_turns", context_window_turns=3)
    assert dataclasses.asdict(config.rollout_config())["context_window_turns"] == 3
    assert config.rollout_config().window_turns == 3
    assert StarPOConfig().training(context_window="single_turn").rollout_config().window_turns == 1
    assert StarPOConfig().rollout_config().window_turns is None
