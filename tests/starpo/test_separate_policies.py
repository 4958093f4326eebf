"""Separate policies for a game's seats, the RLlib way (``config.multi_agent``): each seat played by its policy's
own sampler, each trained policy updated on its own seats' trajectories alone, the frozen ones never."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rllib_ragen import StarPO, StarPOConfig
from rllib_ragen.envs.seat import seat_for_seed
from rllib_ragen.objectives import token_logprobs
from rllib_ragen.sentinel import Rule, echo_trap_rules

from tests.starpo.test_self_play import duet_registered, duet_run
from tests.test_documented_envs import smallest_run

SEAT_POLICY = {"a": "first", "b": "second"}


def by_seat(seat, episode, **kwargs):
    return SEAT_POLICY[seat]


def separate(config: StarPOConfig, trained=("first",)) -> StarPOConfig:
    return config.multi_agent(policies=set(SEAT_POLICY.values()), policy_mapping_fn=by_seat, policies_to_train=trained)


def tic_tac_toe(**training) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment("rllib_ragen/TicTacToe-v0", env_config={"opponent": "random"})
        .training(self_play=True, max_actions_per_turn=1, **training)
    )


def errors_of(config: StarPOConfig) -> str:
    with pytest.raises(ValueError) as error:
        config.validate()
    return str(error.value)


def test_validate_names_what_separate_policies_need():
    x_and_o = {"policies": {"x", "o"}, "policy_mapping_fn": lambda seat, episode, **kw: seat}
    config = tic_tac_toe().multi_agent(**x_and_o, policies_to_train=["x"])
    config.validate()
    assert config.separate_policies and config.trained_policy_ids() == ["x"] and config.seat_policy("o") == "o"
    assert not tic_tac_toe().separate_policies and tic_tac_toe().seat_policy("o") == "default_policy"

    not_a_game = StarPOConfig().environment("rllib_ragen/FrozenLake-v0").multi_agent(**x_and_o)
    assert "set self_play=True" in errors_of(not_a_game)
    assert "league_interval=0" in errors_of(tic_tac_toe(league_interval=5).multi_agent(**x_and_o))
    assert "max_policy_lag=0" in errors_of(tic_tac_toe(max_policy_lag=1).multi_agent(**x_and_o))
    one_for_both = tic_tac_toe().multi_agent(policies={"x", "o"}, policy_mapping_fn=lambda seat, episode, **kw: "x")
    assert "['o'] play no seat of rllib_ragen/TicTacToe-v0" in errors_of(one_for_both)
    unknown = tic_tac_toe().multi_agent(policies={"x", "o"}, policy_mapping_fn=lambda seat, episode, **kw: "z")
    assert "returned 'z', which is not one of ['o', 'x']" in errors_of(unknown)
    needs_episode = tic_tac_toe().multi_agent(
        policies={"x", "o"}, policy_mapping_fn=lambda seat, episode, **kw: episode.agent_ids[0]
    )
    assert "policy_mapping_fn('x', None) raised AttributeError" in errors_of(needs_episode)
    # RLlib's built-in rules, which read default_policy, would never fire: refused, with the per-policy rules named.
    stale = tic_tac_toe(sentinel_rules=echo_trap_rules("warn")).multi_agent(**x_and_o)
    assert "echo_trap_rules(action, policies=...)" in errors_of(stale)
    tic_tac_toe(sentinel_rules=echo_trap_rules("warn", ["x", "o"])).multi_agent(**x_and_o).validate()
    # A rule on the rollout filter's pooled value: each policy has its own filter, so that value is not logged.
    pooled = tic_tac_toe(sentinel_rules=[Rule("rollout_filter/reward_std", "below", 0.01)]).multi_agent(**x_and_o)
    assert "sentinel_rules watch ['rollout_filter/reward_std']" in errors_of(pooled)


def test_echo_trap_rules_per_policy_watch_each_policys_own_values():
    rules = echo_trap_rules("warn", ["first"])
    assert [r.signal for r in rules] == [
        "policies/first/rollout_filter/reward_std",
        "learners/first/actor/entropy",
        "learners/first/actor/grad_norm",
        "policies/first/collapse/reasoning_entropy",
    ]
    assert [r.name for r in rules][:2] == ["reward std vanished (first)", "entropy collapsed (first)"]


def largest_gap(model, trajectories, temperature: float) -> float:
    """The largest difference between the sampler's log-probs of ``trajectories``' sampled tokens and ``model``'s."""
    gaps = []
    for t in trajectories:
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            logp = token_logprobs(model(input_ids=ids).logits, ids, temperature)[0]
        sampled = torch.tensor(t.response_mask, dtype=torch.bool)
        gaps.append((logp[sampled] - torch.tensor(t.behaviour_logprobs)[sampled]).abs().max().item())
    return max(gaps)


def test_each_seat_plays_its_policy_and_only_the_trained_one_learns(ray_session, monkeypatch, tmp_path):
    with duet_registered(monkeypatch):
        config = separate(duet_run(4, advantage_estimator="grpo", lr=1e-3, validation_size=4))
        algo = config.build_algo()
        try:
            start = {policy: algo.policy_weights(policy) for policy in ("first", "second")}
            assert all(torch.equal(v, start["second"][k]) for k, v in start["first"].items())  # the same model
            first = algo.train()
            # RLlib lists every module's learning rate; only the trained one has a loss.
            learners = first["learners"]
            assert "actor/pg_loss" in learners["first"] and "actor/pg_loss" not in learners["second"]
            assert {(t.seat, t.policy_id) for t in algo.last_rollout} == {("a", "first"), ("b", "second")}
            # Each policy's batch is its own seats': seat a wins every game, so first's groups pay it alike.
            assert first["policies/first/update/kept_trajectories"] == 8.0 and "update/kept_trajectories" not in first
            # Frozen to the bit, in the learner and in the sampler; the trained policy moved, and the sampler plays it.
            assert all(torch.equal(v, start["second"][k]) for k, v in algo.policy_weights("second").items())
            assert any(not torch.equal(v, start["first"][k]) for k, v in algo.policy_weights("first").items())
            runner = algo.env_runner
            for policy in ("first", "second"):
                learner = algo.policy_weights(policy)
                assert all(torch.equal(v, learner[k]) for k, v in runner.modules[policy].policy.state_dict().items())

            second = algo.train()
            # Exact to the token, per seat: first's seat was sampled by first's updated weights (the learner scores
            # them alike), second's by the untouched model, which first's no longer matches.
            assert second["learners"]["first"]["rollout/logprob_gap_max"] < 1e-5
            initial = runner.modules["second"].policy
            by_policy = {p: [t for t in algo.last_rollout if t.policy_id == p] for p in ("first", "second")}
            assert largest_gap(initial, by_policy["second"], config.temperature) < 1e-5
            assert largest_gap(initial, by_policy["first"], config.temperature) > 1e-3

            # Validation: each state's seat (the seat environment's: the seed's) played by that seat's policy.
            algo.evaluate_validation_set()
            played = {(seat_for_seed(("a", "b"), t.seed), t.policy_id) for t in algo.last_validation}
            assert played == {("a", "first"), ("b", "second")}

            algo.export_pretrained(tmp_path / "policy")
            for policy in ("first", "second"):
                saved = AutoModelForCausalLM.from_pretrained(tmp_path / "policy" / policy).state_dict()
                assert all(torch.equal(saved[k], v) for k, v in algo.policy_weights(policy).items())
            path = algo.save_to_path(str(tmp_path / "checkpoint"))
            trained = algo.policy_weights("first")
        finally:
            algo.stop()
        restored = StarPO.from_checkpoint(path)
        try:
            assert all(torch.equal(v, trained[k]) for k, v in restored.policy_weights("first").items())
            assert all(torch.equal(v, start["second"][k]) for k, v in restored.policy_weights("second").items())
            played = restored.env_runner.modules["first"].policy.state_dict()
            assert all(torch.equal(v, trained[k]) for k, v in played.items())
        finally:
            restored.stop()


def test_remote_env_runners_play_each_policys_weights(ray_session):
    config = smallest_run(tic_tac_toe(advantage_estimator="grpo", lr=1e-3), num_groups=2)
    config = config.multi_agent(policies={"x", "o"}, policy_mapping_fn=lambda seat, episode, **kw: seat)
    algo = config.env_runners(num_env_runners=1).build_algo()
    try:
        result = algo.train()
        assert set(result["learners"]) >= {"x", "o"}
        learner = {policy: algo.policy_weights(policy) for policy in ("x", "o")}
        assert any(not torch.equal(v, learner["o"][k]) for k, v in learner["x"].items())
        played = algo.env_runner_group.foreach_env_runner(
            lambda runner: {p: m.policy.state_dict() for p, m in runner.modules.items()}, local_env_runner=False
        )[0]
        for policy, tensors in played.items():
            assert all(torch.equal(v, learner[policy][k]) for k, v in tensors.items())
    finally:
        algo.stop()
