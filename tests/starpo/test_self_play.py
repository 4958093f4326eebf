"""Self-play through StarPO: the policy plays every seat of a game, and each seat's advantages have their own
baseline (the same initial state, the same role)."""

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM

from rllib_ragen import StarPOConfig, register_text_env
from rllib_ragen.envs.games import GAMES
from rllib_ragen.starpo.league import League, learner_seat

from tests.rollout.test_seats import TakeTurns
from tests.test_documented_envs import smallest_run, train_one_iteration


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


class Duet(Speeches):
    """Two seats, a then b, two moves each; any reply is a move, and seat a wins whatever is said."""

    possible_agents = ("a", "b")

    def to_move(self):
        return self.possible_agents[len(self.said) % 2]

    def _play(self, seat, action):
        self.said.append(action)
        return None if len(self.said) < 4 else {"a": 1.0, "b": -1.0}


@contextlib.contextmanager
def duet_registered(monkeypatch):
    """Duet as tests/Duet-v0, for one algorithm's life (a restored one registers it again)."""
    import gymnasium as gym

    monkeypatch.setitem(GAMES, "tests/Duet-v0", Duet)
    register_text_env("tests/Duet-v0", "rllib_ragen.envs.seat:SeatEnv", game="tests/Duet-v0")
    try:
        yield
    finally:
        del gym.registry["tests/Duet-v0"]


@contextlib.contextmanager
def restored_duet(monkeypatch, path):
    """The algorithm checkpointed at ``path``, restored with Duet registered, stopped afterwards."""
    from rllib_ragen import StarPO

    with duet_registered(monkeypatch):
        algo = StarPO.from_checkpoint(path)
        try:
            yield algo
        finally:
            algo.stop()


def duet_run(num_groups: int = 1, **training) -> StarPOConfig:
    """Self-play of Duet at the smallest sizes that train (:func:`smallest_run`), with ``training`` over it."""
    config = StarPOConfig().environment("tests/Duet-v0", env_config={"opponent": "random"})
    return smallest_run(config.training(self_play=True, max_actions_per_turn=1, **training), num_groups=num_groups)


def test_league_keeps_the_newest_snapshots_and_draws_by_seed():
    league = League(interval=2, size=2)
    assert [i for i in range(7) if league.due(i)] == [0, 2, 4, 6]
    for iteration in (0, 2, 4):
        league.add(iteration, {"w": torch.full((2,), float(iteration))})
    assert list(league.snapshots) == ["snapshot_2", "snapshot_4"]  # the oldest left
    assert not league.due(4)  # already in: a resumed run does not take it twice
    draws = league.draw(64, (0, 5))
    assert draws == league.draw(64, (0, 5)) and set(draws) == {None, "snapshot_2", "snapshot_4"}
    restored = League(2, 2)
    restored.set_state(league.get_state())
    assert list(restored.snapshots) == list(league.snapshots)


def test_a_league_plays_frozen_snapshots_and_trains_the_learner_only(ray_session, monkeypatch, tmp_path):
    with duet_registered(monkeypatch):
        algo = duet_run(6, league_interval=1, league_size=2, advantage_estimator="grpo", lr=1e-3).build_algo()
        try:
            warm_start = algo.policy_weights()
            algo.train()
            after_first = algo.policy_weights()
            result = algo.train()
            league = algo.rollouts.league
            assert list(league.snapshots) == ["snapshot_0", "snapshot_1"]
            # Frozen: the warm start's snapshot is its weights to the bit after two updates that moved the learner's.
            assert all(torch.equal(league.snapshots["snapshot_0"][k], v) for k, v in warm_start.items())
            assert all(torch.equal(league.snapshots["snapshot_1"][k], v) for k, v in after_first.items())
            assert any(not torch.equal(v, warm_start[k]) for k, v in algo.policy_weights().items())
            for name, sampler in algo.env_runner._snapshots.items():  # what the runner plays them with
                assert all(torch.equal(v, league.snapshots[name][k]) for k, v in sampler.model.state_dict().items())
            # A snapshot not drawn in one rollout keeps its sampler for the next; past league_size the oldest leaves.
            runner, snapshot = algo.env_runner, league.snapshots
            first = runner._snapshot_backends({"snapshot_0": snapshot["snapshot_0"]})["snapshot_0"]
            assert list(runner._snapshot_backends({"snapshot_1": snapshot["snapshot_1"]})) == ["snapshot_1"]
            assert runner._snapshot_backends({"snapshot_0": snapshot["snapshot_0"]})["snapshot_0"] is first
            runner._snapshot_backends({"snapshot_2": snapshot["snapshot_1"]})
            assert sorted(runner._snapshots) == ["snapshot_1", "snapshot_2"]
            # Iteration 1's groups: self-play (both seats trained) or the learner in its seed's seat against a snapshot
            # (the snapshot's seat played, not trained). Seat a always wins: the league's win rate is the share of those
            # games the learner played as a.
            opponents = league.draw(6, (0, 1))
            assert any(opponents) and not all(opponents)
            trained = algo.last_rollout
            assert all(t.policy_id == "default_policy" for t in trained)
            for g, opponent in enumerate(opponents):
                seats = sorted(t.seat for t in trained if t.group // 2 == g)
                if opponent is None:
                    assert seats == ["a", "a", "b", "b"]
                else:
                    seed = next(t.seed for t in trained if t.group // 2 == g)
                    assert seats == [learner_seat(("a", "b"), seed)] * 2
            league_games = [t for t in trained if opponents[t.group // 2] is not None]
            rollout = result["env_runners"]
            assert rollout["league/games"] == len(league_games) == 2 * sum(map(bool, opponents))
            assert rollout["league/win_rate"] == sum(t.seat == "a" for t in league_games) / len(league_games)
            assert rollout["league/snapshots"] == 2.0
            # Exported as model folders (what a rating table plays): each loads with plain transformers as its
            # snapshot to the bit, and the runner's own policy still plays the learner's weights.
            folders = algo.export_league(tmp_path / "league")
            assert [f.name for f in folders] == ["snapshot_0", "snapshot_1"]
            for folder in folders:
                loaded = AutoModelForCausalLM.from_pretrained(folder).state_dict()
                assert all(torch.equal(loaded[k], v) for k, v in league.snapshots[folder.name].items())
            learner = algo.policy_weights()
            assert all(torch.equal(v, learner[k]) for k, v in algo.env_runner.module.policy.state_dict().items())
            # The league is in the checkpoint: a restored algorithm plays the same snapshots.
            path = algo.save_to_path(str(tmp_path / "checkpoint"))
        finally:
            algo.stop()
    with restored_duet(monkeypatch, path) as restored:
        assert list(restored.rollouts.league.snapshots) == list(league.snapshots)
        for name, tensors in league.snapshots.items():
            assert all(torch.equal(restored.rollouts.league.snapshots[name][k], v) for k, v in tensors.items())


def test_a_league_needs_self_play_and_two_seats():
    with pytest.raises(ValueError, match="league_interval=2: a league is of self-play"):
        StarPOConfig().environment("rllib_ragen/TicTacToe-v0").training(league_interval=2).validate()
    StarPOConfig().environment("rllib_ragen/TicTacToe-v0").training(
        self_play=True, league_interval=2, max_actions_per_turn=1
    ).validate()


def test_a_league_plays_on_remote_env_runners(ray_session):
    """The snapshots a rollout draws travel to a remote env runner with its groups; what comes back is the learner's
    alone, one seat a league group (tic-tac-toe: a game the snapshot forfeits before the learner moves has only the
    snapshot's trajectory, and counts for the league all the same)."""
    config = smallest_run(
        StarPOConfig()
        .environment("rllib_ragen/TicTacToe-v0", env_config={"opponent": "random"})
        .training(self_play=True, league_interval=1, advantage_estimator="grpo", max_actions_per_turn=1),
        num_groups=6,
    ).env_runners(num_env_runners=1)
    algo = config.build_algo()
    try:
        algo.train()
        result = algo.train()
        opponents = algo.rollouts.league.draw(6, (0, 1))
        assert any(opponents) and list(algo.rollouts.league.snapshots) == ["snapshot_0", "snapshot_1"]
        trained = algo.last_rollout
        assert trained and all(t.policy_id == "default_policy" for t in trained)
        for g, opponent in enumerate(opponents):
            mine = [t for t in trained if t.group // 2 == g]
            if opponent is not None:
                assert all(t.seat == learner_seat(("x", "o"), t.seed) for t in mine)
        assert result["env_runners"]["league/games"] == 2 * sum(map(bool, opponents))
    finally:
        algo.stop()


def test_rae_keeps_a_running_baseline_per_seat_through_the_learner_and_checkpoints(ray_session, monkeypatch, tmp_path):
    # Duet pays seat a +1 and seat b -1 in every game. At rae_decay 0.5 each seat's baseline reads 0, then moves
    # halfway to its return: a's two trajectories get advantages 1 and 0.5, b's -1 and -0.5, and the seats' baselines
    # end at 0.75 and -0.75. The probe (every iteration here) hands back the learner's own token advantages.
    with duet_registered(monkeypatch):
        config = duet_run(advantage_estimator="rae", rae_decay=0.5, format_penalty=0.0)
        algo = config.training(collapse_diagnostics_interval=1).build_algo()
        try:
            result = algo.train()
            assert result["update/role_baseline/tests/Duet-v0/a"] == 0.75
            assert result["update/role_baseline/tests/Duet-v0/b"] == -0.75
            by_seat = {seat: [i for i, t in enumerate(algo.last_rollout) if t.seat == seat] for seat in ("a", "b")}
            tokens = algo.last_token_advantages
            advantages = {seat: sorted({v for i in rows for v in tokens[i] if v}) for seat, rows in by_seat.items()}
            assert advantages == {"a": [0.5, 1.0], "b": [-1.0, -0.5]}
            path = algo.save_to_path(str(tmp_path / "checkpoint"))
        finally:
            algo.stop()
    with restored_duet(monkeypatch, path) as restored:
        assert restored.role_baselines.values == {"tests/Duet-v0/a": 0.75, "tests/Duet-v0/b": -0.75}
