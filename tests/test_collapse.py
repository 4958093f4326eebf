"""The echo-trap diagnostics against hand-computed values (no Ray, no model)."""

import math
import re

import numpy as np
import pytest

from rllib_ragen import StarPOConfig
from rllib_ragen import metrics as M
from rllib_ragen.collapse import (
    cross_scoring,
    cross_scoring_pairs,
    probe_schedule,
    distinct_n,
    reasoning_entropy,
    reply_diagnostics,
    variance_buckets,
)
from rllib_ragen.rollout.trajectory import Trajectory
from rllib_ragen.rollout.protocol import REGION_ANSWER, REGION_OTHER, REGION_THINK

O, T, A = REGION_OTHER, REGION_THINK, REGION_ANSWER


def trajectory(group, prompt, replies, regions):
    """A trajectory of `prompt` then each reply (no observation between them: enough for these statistics)."""
    ids, spans, token_regions = list(prompt), [], [O] * len(prompt)
    for reply, reply_regions in zip(replies, regions):
        spans.append((len(ids), len(ids) + len(reply)))
        ids += reply
        token_regions += reply_regions
    return Trajectory(
        env_name="e",
        group=group,
        seed=group,
        token_ids=ids,
        response_mask=[0] * len(ids),
        behaviour_logprobs=[0.0] * len(ids),
        turn_spans=spans,
        turn_rewards=[0.0] * len(spans),
        token_regions=token_regions,
    )


def test_reply_diagnostics_by_hand():
    # Group 0: two episodes whose first replies are identical (an echo), second replies differ.
    # Group 1: one episode of one reply.
    a = trajectory(0, [1, 2], [[5, 6, 7, 9], [5, 8]], [[O, T, T, A], [O, A]])
    b = trajectory(0, [1, 2], [[5, 6, 7, 9], [6, 8]], [[O, T, T, A], [T, A]])
    c = trajectory(1, [3], [[5, 6, 5, 6]], [[T, T, T, A]])
    d = reply_diagnostics([a, b, c])
    # Turns: 5. Think tokens 2, 0, 2, 1, 3 -> 8/5; answer tokens 1, 1, 1, 1, 1 -> 1.
    assert d[M.THINK_TOKENS_PER_TURN] == pytest.approx(8 / 5)
    assert d[M.ANSWER_TOKENS_PER_TURN] == pytest.approx(1.0)
    # Bigrams: (5,6)(6,7)(7,9) x2, (5,8), (6,8), (5,6)(6,5)(5,6) = 11 bigrams, distinct:
    # (5,6)(6,7)(7,9)(5,8)(6,8)(6,5) = 6.
    assert d[M.DISTINCT_2] == pytest.approx(6 / 11)
    # Group 0: 8 bigrams, 5 distinct; group 1: 3 bigrams, 2 distinct.
    assert d[M.DISTINCT_2_IN_GROUP] == pytest.approx((5 / 8 + 2 / 3) / 2)
    # The two identical first replies of group 0 repeat each other: 2 of 5 replies.
    assert d[M.REPEAT_RATE] == pytest.approx(2 / 5)
    # First-turn reasonings (think tokens only): (6, 7) twice and (5, 6, 5) once.
    assert d[M.REASONING_ENTROPY] == pytest.approx(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))


def test_reasoning_entropy_sees_a_template_collapse_that_bigrams_miss():
    varied = [f"Optimal plan has {n} moves." for n in (1, 2, 2, 3)]
    collapsed = ["Optimal plan has 1 moves."] * 4
    assert reasoning_entropy(varied) == pytest.approx(-0.5 * math.log(0.5) - 2 * 0.25 * math.log(0.25))
    assert reasoning_entropy(collapsed) == 0.0
    assert reasoning_entropy(["a", "b", "c"]) == pytest.approx(math.log(3))
    assert math.isnan(reasoning_entropy([]))


def test_reasoning_entropy_reads_the_first_turns_reasoning_alone():
    # Same first-turn reasoning (6, 7), different answers and later turns: one reasoning, entropy 0.
    a = trajectory(0, [1], [[6, 7, 8], [2, 3]], [[T, T, A], [T, A]])
    b = trajectory(1, [1], [[6, 7, 9], [4, 5]], [[T, T, A], [T, A]])
    assert reply_diagnostics([a, b])[M.REASONING_ENTROPY] == 0.0


def test_answer_only_replies_have_no_reasoning_entropy():
    a = trajectory(0, [1], [[5, 6]], [[A, A]])
    b = trajectory(1, [1], [[7, 8]], [[A, A]])
    assert M.REASONING_ENTROPY not in reply_diagnostics([a, b])


def test_identical_replies_at_different_turns_are_not_repeats():
    a = trajectory(0, [1], [[5, 6], [7, 8]], [[T, A], [T, A]])
    b = trajectory(0, [1], [[7, 8], [5, 6]], [[T, A], [T, A]])
    assert reply_diagnostics([a, b])[M.REPEAT_RATE] == 0.0


def test_distinct_n_edge_cases():
    assert distinct_n([[1]], 2) == 1.0  # no bigram at all
    assert distinct_n([[1, 1, 1, 1]], 2) == pytest.approx(1 / 3)
    assert distinct_n([[1, 2], [2, 3]], 2) == 1.0  # no bigram spans two replies


def test_cross_scoring_by_hand():
    # Reasoning 0 is best explained by its own prompt, reasoning 1 by prompt 0.
    scores = np.array([[-1.0, -3.0], [-2.0, -4.0]])
    d = cross_scoring(scores)
    assert d[M.RETRIEVAL_ACCURACY] == 0.5
    # MI: row 0: -1 - log((e^-1 + e^-3) / 2); row 1: -4 - log((e^-2 + e^-4) / 2).
    row0 = -1 - math.log((math.exp(-1) + math.exp(-3)) / 2)
    row1 = -4 - math.log((math.exp(-2) + math.exp(-4)) / 2)
    assert d[M.MI_ESTIMATE] == pytest.approx((row0 + row1) / 2)
    assert d[M.CROSS_SCORE_MARGIN] == pytest.approx(((-1 + 3) + (-4 + 2)) / 2)


def test_cross_scoring_of_state_blind_reasoning_is_chance_and_zero_information():
    scores = np.tile(np.array([[-5.0, -5.0, -5.0]]), (3, 1))  # every prompt explains every reasoning equally
    d = cross_scoring(scores)
    assert d[M.RETRIEVAL_ACCURACY] == 0.0  # a tie is not a retrieval
    assert d[M.MI_ESTIMATE] == pytest.approx(0.0, abs=1e-12)
    perfect = cross_scoring(np.where(np.eye(3, dtype=bool), 0.0, -1e6))
    assert perfect[M.RETRIEVAL_ACCURACY] == 1.0
    assert perfect[M.MI_ESTIMATE] == pytest.approx(math.log(3))  # the bound: log m


def test_cross_scoring_pairs_takes_one_first_turn_per_group_and_scores_the_reasoning():
    a = trajectory(0, [1, 2], [[5, 6, 7, 9, 4]], [[O, T, T, O, A]])
    b = trajectory(0, [1, 2], [[5, 8, 8, 9, 4]], [[O, T, T, O, A]])  # same group: skipped
    c = trajectory(1, [3], [[7, 7, 4]], [[O, A, A]])  # no reasoning: the whole reply is scored
    pairs = cross_scoring_pairs([a, b, c], subsample=8)
    assert pairs.prompts == [[1, 2], [3]]
    assert pairs.continuations == [[5, 6, 7], [7, 7, 4]]  # up to the end of the reasoning
    assert pairs.scored == [[0, 1, 1], [1, 1, 1]]
    ids, masks, index = pairs.sequences()
    assert index == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ids[1] == [3, 5, 6, 7] and masks[1] == [0, 0, 1, 1]  # reasoning 0 after prompt 1
    assert cross_scoring_pairs([a, b, c], subsample=1) is None  # one prompt: nothing to compare
    assert len(cross_scoring_pairs([a, c, trajectory(2, [4], [[1, 2]], [[T, A]])], subsample=2)) == 2


def test_variance_buckets():
    returns = np.array([1, 1, 0, 1, 0, 0, 0, 1, 5, 0])
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    # stds: g0 0, g1 0.5, g2 0, g3 0.5, g4 2.5; the median of the non-zero ones is 0.5.
    buckets = variance_buckets(returns, groups)
    assert buckets["zero"].tolist() == [0, 1, 4, 5]
    assert buckets["low"].tolist() == [2, 3, 6, 7]
    assert buckets["high"].tolist() == [8, 9]
    assert set(variance_buckets(np.zeros(4), np.array([0, 0, 1, 1]))) == {"zero"}


def test_jobs_report_the_reasoning_entropy_of_the_validation_episodes(tmp_path, capsys):
    """Before: the solver states each level's plan length; after: one fixed sentence for every level."""
    import gymnasium as gym

    from rllib_ragen.jobs.outputs import SAMPLED_AND_GREEDY
    from rllib_ragen.jobs.report import _reasoning_entropy
    from rllib_ragen.jobs.report_tables import print_paired
    from rllib_ragen.jobs.outputs import write_rollouts
    from rllib_ragen.rollout.backends import SamplingParams, ScriptedBackend
    from rllib_ragen.rollout.rollout_config import RolloutConfig
    from rllib_ragen.rollout.engine import RolloutEngine
    from rllib_ragen.rollout.models import load_policy
    from rllib_ragen.demonstrators import sokoban_solver_policy

    _, tokenizer = load_policy("tiny", seed=0)
    seeds = list(range(123, 135))
    config = RolloutConfig(env="rllib_ragen/Sokoban-v0", max_turns=1)
    solver = sokoban_solver_policy()
    policies = {
        "before": solver,
        "after": lambda prompt: re.sub("<think>.*</think>", "<think>Push.</think>", solver(prompt)),
    }
    for when, policy in policies.items():
        episodes, _ = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer).rollout(
            seeds, 1, SamplingParams()
        )
        for mode, files in SAMPLED_AND_GREEDY.items():
            write_rollouts(tmp_path / files[0 if when == "before" else 1], episodes, tokenizer, iteration=0)
    env = gym.make("rllib_ragen/Sokoban-v0")
    lengths = []
    for seed in seeds:
        env.reset(seed=seed)
        lengths.append(env.unwrapped.optimal_solution_length())
    shares = [lengths.count(n) / len(seeds) for n in set(lengths)]
    expected_before = -sum(p * math.log(p) for p in shares)
    assert len(shares) > 1  # the levels differ in length, so the stated lengths carry entropy
    entropy = _reasoning_entropy(tmp_path, None)
    for mode in ("sampled", "greedy"):
        assert entropy[mode] == {"before": pytest.approx(expected_before), "after": 0.0, "episodes": 12}
    print_paired({"reasoning_entropy": entropy}, StarPOConfig())
    assert (
        f"reasoning entropy, greedy   {expected_before:.3f} -> 0.000 nats over 12 first turns (at most 2.48)"
        in capsys.readouterr().out
    )


def test_the_probe_schedule_puts_the_gradient_norms_on_the_first_probe_of_each_window():
    def runs(probe, gradients, n):
        schedule = [probe_schedule(i, probe, gradients) for i in range(n)]
        return [i for i, (p, _) in enumerate(schedule) if p], [i for i, (_, g) in enumerate(schedule) if g]

    assert runs(5, 50, 110) == (list(range(0, 110, 5)), [0, 50, 100])
    assert runs(3, 50, 110) == (list(range(0, 110, 3)), [0, 51, 102])  # 50 and 100 have no probe
    assert runs(1, 1, 4) == ([0, 1, 2, 3], [0, 1, 2, 3])
    assert runs(5, 0, 20) == ([0, 5, 10, 15], [])
    assert runs(0, 50, 120) == ([], [])  # the probe off switches the gradient norms off too
