"""Saved policies against each other in a game: seats by seed, payoffs per game, the same games before and after."""

import torch

from rllib_ragen import StarPOConfig
from rllib_ragen.envs.kuhn_poker import DECISIONS, decision_views
from rllib_ragen.jobs.matches import (
    kuhn_strategy,
    match_outcomes,
    paired_matches,
    play_against,
    play_one_seat,
    round_robin,
)
from rllib_ragen.rollout.models import load_policy


def _tiny_policy(folder, seed):
    """The tiny model initialised by ``seed``, with seed 0's tokenizer (so two policies read the same texts)."""
    model, _ = load_policy("tiny", seed=seed)
    _, tokenizer = load_policy("tiny", seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _config():
    return (
        StarPOConfig()
        .environment("rllib_ragen/TicTacToe-v0")
        .rl_module(model_config={"model": "tiny"})
        .training(enable_thinking=False, max_actions_per_turn=1, max_turns=5, max_new_tokens_per_turn=8)
    )


def test_the_agent_takes_the_seed_s_seat_and_a_policy_paired_with_itself_changes_nothing(tmp_path):
    torch.set_num_threads(1)
    agent, other = _tiny_policy(tmp_path / "a", 0), _tiny_policy(tmp_path / "b", 1)
    config = _config()
    played = play_against(config, agent, other, 6, seed_start=10)
    agent_seats = {t.seed: t.seat for t in played if t.policy_id == "agent"}
    assert all(seat == "xo"[seed % 2] for seed, seat in agent_seats.items())
    assert {t.seat for t in played if t.policy_id == "opponent" and t.seed in agent_seats} <= {"x", "o"}
    outcome = match_outcomes(played)
    assert outcome["games"] == 6  # every game, those the agent never moved in too
    for t in played:  # zero-sum: where both moved, their outcomes mirror each other
        expected = t.outcome if t.policy_id == "agent" else {"win": "loss", "loss": "win"}.get(t.outcome, t.outcome)
        assert outcome["scores"][t.seed] == {"win": 1.0, "loss": -1.0}.get(expected, 0.0)
    assert abs(sum(outcome[f"{o}_rate"] for o in ("win", "draw", "loss", "unfinished")) - 1.0) < 1e-12
    # The same policy before and after, on the same games and sampling seed: every game is played again alike.
    result = paired_matches(config, agent, agent, other, games=6)
    assert result["before"]["scores"] == result["after"]["scores"]
    assert result["paired"]["difference"] == 0.0 and result["paired"]["improved"] == result["paired"]["worsened"] == 0


def test_a_policy_s_kuhn_strategy_counts_every_decision_it_made(tmp_path):
    # The untrained tiny model seldom names a legal move: each hand's decisions are read at the point the seat was
    # shown, a hand forfeited at its first decision counted as no move there. The seat is the seed's.
    torch.set_num_threads(1)
    policy = _tiny_policy(tmp_path / "a", 0)
    config = _config().environment("rllib_ragen/KuhnPoker-v0").training(max_turns=2, max_actions_per_episode=2)
    played = play_one_seat(config, policy, "random", 8)
    assert [t.seed % 2 for t in played] == [0, 1] * 4 and len({t.seed for t in played}) == 8
    assert all(t.turn_states[0].startswith(("first\n", "second\n")[t.seed % 2]) for t in played)
    read = kuhn_strategy(config, policy, 8)
    views = decision_views()
    decisions = [
        (views[key.split("\n", 1)[1]][1], actions)
        for t in played
        for key, actions in zip(t.turn_states, t.turn_actions)
    ]
    no_move = [not actions or actions[0] not in DECISIONS[point[1]][1] for point, actions in decisions]
    assert sum(sum(c.values()) for c in read["counts"].values()) == len(decisions) >= 8
    assert sum(c["none"] for c in read["counts"].values()) == sum(no_move)
    assert read["no_move_rate"] == sum(no_move) / len(decisions)


def test_a_round_robin_plays_each_deal_from_both_seats_so_a_policy_against_itself_scores_even(tmp_path):
    torch.set_num_threads(1)
    policy, other = _tiny_policy(tmp_path / "a", 0), _tiny_policy(tmp_path / "b", 1)
    config = _config().environment("rllib_ragen/KuhnPoker-v0").training(max_turns=2, max_actions_per_episode=2)
    results, pairs = round_robin(config, {"one": policy, "same": policy, "other": other}, 6)
    assert list(results) == [("one", "same"), ("one", "other"), ("same", "other")]
    assert all(len(scores) == 12 and set(scores) <= {0.0, 0.5, 1.0} for scores in results.values())
    # The same policy in both roles of every deal: whatever a seat's cards and luck gave it, each side had it once.
    assert sum(results[("one", "same")]) == 6.0
    assert results[("one", "other")] == results[("same", "other")]  # the same model, the same games
    # Its first half is "one" as the agent, its second "other" as the agent on the same deals, mirrored.
    one_as_agent = match_outcomes(play_against(config, policy, other, 6))["scores"].values()
    other_as_agent = match_outcomes(play_against(config, other, policy, 6))["scores"].values()
    assert results[("one", "other")] == [(1 + s) / 2 for s in one_as_agent] + [(1 - s) / 2 for s in other_as_agent]
    assert set(pairs) == {f"{a} vs {b}" for a in ("one", "same", "other") for b in ("one", "same", "other") if a != b}
