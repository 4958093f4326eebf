"""Self-play through StarPO: the policy plays every seat of a game, and each seat's advantages have their own
baseline (the same initial state, the same role)."""

import pytest

from rllib_ragen import StarPOConfig, register_text_env
from rllib_ragen.envs.games import GAMES

from tests.rollout.test_seats import TakeTurns
from tests.test_documented_envs import train_one_iteration


class Speeches(TakeTurns):
    """TakeTurns with a move list (so that a random opponent can play it in validation): a fixed payoff per seat,
    a: 1, b: 0, c: -1, whatever is said."""

    action_vocabulary = ("yes", "no")

    def legal_actions(self, seat):
        return list(self.action_vocabulary)


def test_self_play_needs_a_built_in_game_and_one_move_a_turn():
    config = StarPOConfig().environment("rllib_ragen/Sokoban-v0").training(self_play=True)
    with pytest.raises(ValueError) as error:
        config.validate()
    assert "env must name a built-in game" in str(error.value) and "max_actions_per_turn=1" in str(error.value)
    StarPOConfig().environment("rllib_ragen/KuhnPoker-v0").training(self_play=True, max_actions_per_turn=1).validate()


def test_one_iteration_trains_every_seat_with_a_baseline_per_seat(ray_session, monkeypatch):
    import gymnasium as gym

    monkeypatch.setitem(GAMES, "tests/Speeches-v0", Speeches)
    register_text_env("tests/Speeches-v0", "rllib_ragen.envs.seat:SeatEnv", game="tests/Speeches-v0")
    try:
        config = (
            StarPOConfig()
            .environment("tests/Speeches-v0", env_config={"opponent": "random"})
            .training(
                self_play=True,
                advantage_estimator="grpo",
                entropy_coeff=0.0,  # the policy's gradient is then its advantages' alone
                max_actions_per_turn=1,
                format_penalty=0.0,  # every seat's return is then its payoff alone
            )
        )
        result = train_one_iteration(config, trajectories=6)  # one group: 2 games, 3 seats each
    finally:
        del gym.registry["tests/Speeches-v0"]
    rollout = result["env_runners"]
    assert rollout["tests/Speeches-v0/a/win_rate"] == 1.0 and rollout["tests/Speeches-v0/c/loss_rate"] == 1.0
    # Each seat's group pays it the same (1, 0 or -1): against its own seat's baseline every GRPO advantage is 0, and
    # so is the policy's gradient. One baseline over the whole game would give seat a +1 and seat c -1.
    assert result["learners"]["default_policy"]["actor/grad_norm"] == 0.0


def test_self_play_validates_against_several_opponents(ray_session, monkeypatch):
    """validation_envs names each opponent (one seat of the game against it, as a text environment); training still
    plays every seat of the one game. Its starts then name their environment, which the self-play runner reads past."""
    import gymnasium as gym

    opponents = [
        {"env": "rllib_ragen/TicTacToe-v0", "env_config": {"opponent": name}, "name": f"vs {name}"}
        for name in ("random", "minimax")
    ]
    config = (
        StarPOConfig()
        .environment("rllib_ragen/TicTacToe-v0", env_config={"opponent": "random"}, validation_envs=opponents)
        .training(self_play=True, advantage_estimator="grpo", max_actions_per_turn=1)
    )
    config.validate()
    assert [e.name for e in config.validation_environments()] == ["vs random", "vs minimax"]
    with pytest.raises(ValueError, match="train_envs"):
        StarPOConfig().environment(
            "rllib_ragen/TicTacToe-v0", train_envs=[{"env": "rllib_ragen/TicTacToe-v0", "groups": 2}]
        ).training(self_play=True, max_actions_per_turn=1, num_groups=2).validate()

    monkeypatch.setitem(GAMES, "tests/Speeches-v0", Speeches)
    register_text_env("tests/Speeches-v0", "rllib_ragen.envs.seat:SeatEnv", game="tests/Speeches-v0")
    seats = [
        {"env": "tests/Speeches-v0", "env_config": {"opponent": "random", "seat": seat}, "name": f"as {seat}"}
        for seat in ("a", "c")
    ]
    try:
        config = (
            StarPOConfig()
            .environment("tests/Speeches-v0", env_config={"opponent": "random"}, validation_envs=seats)
            .training(self_play=True, advantage_estimator="grpo", max_actions_per_turn=1)
        )
        result = train_one_iteration(config, trajectories=6)  # every seat of both games, as without validation_envs
    finally:
        del gym.registry["tests/Speeches-v0"]
    assert result["env_runners"]["tests/Speeches-v0/a/win_rate"] == 1.0
