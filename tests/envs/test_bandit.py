import gymnasium as gym
import numpy as np
import pytest

import rllib_ragen  # noqa: F401  (registers the envs)


def _pull_many(env_id, arm, n=4000):
    env = gym.make(env_id)
    rewards, successes = [], []
    for seed in range(n):
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step(arm)
        assert terminated
        rewards.append(reward)
        successes.append(info["success"])
    return np.array(rewards), np.array(successes)


@pytest.mark.parametrize(
    "env_id, safe, risky",
    [
        ("rllib_ragen/Bandit-v0", "Phoenix", "Dragon"),
        ("rllib_ragen/BanditHeldOut-v0", "Librarian", "Trader"),
        ("rllib_ragen/BanditReversed-v0", "Dragon", "Phoenix"),
    ],
)
def test_payoffs_match_their_expectations(env_id, safe, risky):
    safe_rewards, safe_success = _pull_many(env_id, safe)
    assert np.all(safe_rewards == 0.15) and not safe_success.any()
    risky_rewards, risky_success = _pull_many(env_id, risky)
    assert set(np.unique(risky_rewards)) == {0.0, 1.0} and risky_success.all()
    # Bernoulli(0.25) mean over 4000 pulls: std 0.0068; allow 4 sigma.
    assert abs(risky_rewards.mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / 4000)


def test_arm_order_is_shuffled_per_seed():
    env = gym.make("rllib_ragen/Bandit-v0")
    orders = [env.reset(seed=s)[0] for s in range(200)]
    assert set(orders) == {"Arms: Phoenix, Dragon", "Arms: Dragon, Phoenix"}
    assert 60 < orders.count("Arms: Dragon, Phoenix") < 140


def test_best_arm_follows_expected_value():
    # A safe arm paying more than the risky arm's expectation becomes the right choice.
    env = gym.make("rllib_ragen/Bandit-v0", low_risk_reward=0.5)
    env.reset(seed=0)
    assert env.step("phoenix")[4]["success"] is True


def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError, match="differ"):
        gym.make("rllib_ragen/Bandit-v0", low_risk_name="A", high_risk_name="a")
    with pytest.raises(ValueError, match="high_risk_prob"):
        gym.make("rllib_ragen/Bandit-v0", high_risk_prob=1.5)


def test_a_transition_seed_keeps_the_start_and_draws_the_payoff_from_its_own_generator():
    from rllib_ragen.envs import TRANSITION_SEED

    env = gym.make("rllib_ragen/Bandit-v0")
    shared, own = [], []
    for seed in range(200):
        start = env.reset(seed=seed)[0]
        shared.append(env.step("Dragon")[1])
        assert env.reset(seed=seed, options={TRANSITION_SEED: (seed, 1)})[0] == start  # the same arm order
        own.append(env.step("Dragon")[1])
        # The payoff is the first draw of the generator seeded by (seed, 1): Bernoulli(0.25).
        expected = 1.0 if np.random.default_rng(np.random.SeedSequence((seed, 1))).random() < 0.25 else 0.0
        assert own[-1] == expected
    shared, own = np.array(shared), np.array(own)
    # Independent Bernoulli(0.25) pairs disagree with probability 0.375: about 75 of 200, never 0.
    assert 40 < (shared != own).sum() < 110
