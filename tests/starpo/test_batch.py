"""From a rollout to the learner's batch, on hand-built trajectories: filter, rewards on tokens, advantages, shards.

No Ray session: ``prepare_update_batch`` is plain Python on trajectories and a config.
"""

import dataclasses

import numpy as np
import pytest
import torch

from rllib_ragen import StarPOConfig
from rllib_ragen.objectives import ADVANTAGE_ESTIMATORS, compute_advantages, register_advantage_estimator
from rllib_ragen.rollout.trajectory import Trajectory
from rllib_ragen.starpo.batch_advantages import batch_advantages
from rllib_ragen.starpo.update_batch import prepare_update_batch, shard_by_groups

PAD = 0


def trajectory(group: int, turn_rewards: list[float], prompt: int = 2, reply: int = 2, observation: int = 1):
    """A conversation: ``prompt`` tokens, then per turn ``reply`` sampled tokens and (between turns) an observation.

    Token ids count up from 10, so every position is distinguishable; sampled tokens have log-prob -0.5.
    """
    ids, mask, spans = list(range(10, 10 + prompt)), [0] * prompt, []
    for turn in range(len(turn_rewards)):
        start = len(ids)
        ids += list(range(len(ids) + 10, len(ids) + 10 + reply))
        mask += [1] * reply
        spans.append((start, len(ids)))
        if turn < len(turn_rewards) - 1:
            ids += list(range(len(ids) + 10, len(ids) + 10 + observation))
            mask += [0] * observation
    logprobs = [-0.5 * m for m in mask]
    return Trajectory("test/Env-v0", group, 100 + group, ids, mask, logprobs, spans, list(turn_rewards))


def config(**training):
    return StarPOConfig().training(**{"num_groups": 3, "group_size": 2, "rollout_filter_ratio": 1.0, **training})


def test_filter_keeps_whole_groups_in_group_order_and_pads_right():
    # Group stds: g0 = 0 (1, 1), g1 = 0.5 (1, 0), g2 = 1.5 (3, 0). Keeping 2 of 3 keeps g1 and g2.
    rollout = [
        trajectory(0, [1.0]),
        trajectory(0, [1.0]),
        trajectory(1, [1.0]),
        trajectory(1, [0.0], reply=3),
        trajectory(2, [3.0]),
        trajectory(2, [0.0]),
    ]
    columns, metrics = prepare_update_batch(rollout, config(rollout_filter_ratio=0.5, advantage_estimator="raw"), PAD)
    assert columns["group"].tolist() == [1, 1, 2, 2]
    assert metrics["update/kept_trajectories"] == 4 and metrics["rollout_filter/kept_groups"] == 2
    assert columns["input_ids"].shape == (4, 5)  # the longest kept trajectory: 2 prompt + 3 reply tokens
    assert columns["input_ids"][0].tolist() == [10, 11, 12, 13, PAD]
    assert columns["attention_mask"][0].tolist() == [1, 1, 1, 1, 0]
    assert columns["response_mask"][1].tolist() == [0, 0, 1, 1, 1]
    assert columns["behaviour_logprobs"][1].tolist() == [0, 0, -0.5, -0.5, -0.5]
    assert metrics["update/response_length"] == (2 + 3 + 2 + 2) / 4


@pytest.mark.parametrize("per_env, kept", [(False, {"a": 2, "b": 0}), (True, {"a": 1, "b": 1})])
def test_a_mixture_counts_kept_groups_per_environment_and_can_filter_within_each(per_env, kept):
    # Environment a plays g0 (std 1.5), g1 (std 0.5); environment b plays g2 (std 0): the batch-wide filter keeps
    # 2 of 3 groups, both from a; per environment it keeps ceil(0.5 x 2) = 1 of a and ceil(0.5 x 1) = 1 of b.
    rollout = [
        dataclasses.replace(trajectory(g, [r]), env_name=name)
        for g, r, name in [(0, 3.0, "a"), (0, 0.0, "a"), (1, 1.0, "a"), (1, 0.0, "a"), (2, 1.0, "b"), (2, 1.0, "b")]
    ]
    mixture = config(rollout_filter_ratio=0.5, advantage_estimator="raw", rollout_filter_per_env=per_env)
    mixture.environment(
        train_envs=[
            {"env": "rllib_ragen/Sokoban-v0", "groups": 2, "name": "a"},
            {"env": "rllib_ragen/FrozenLake-v0", "groups": 1, "name": "b"},
        ]
    )
    assert mixture.num_kept_groups == 2 and mixture.kept_batch_size == 4  # the same count both ways here
    columns, metrics = prepare_update_batch(rollout, mixture, PAD)
    assert columns["group"].tolist() == ([0, 0, 2, 2] if per_env else [0, 0, 1, 1])
    assert {name: metrics[f"rollout_filter/kept_groups/{name}"] for name in "ab"} == kept


def test_the_kept_count_is_each_environments_share_rounded_up_with_the_filter_per_environment():
    three_and_one = [{"env": "rllib_ragen/Sokoban-v0", "groups": 3}, {"env": "rllib_ragen/FrozenLake-v0", "groups": 1}]
    batch_wide = StarPOConfig().environment(train_envs=three_and_one).training(num_groups=4, group_size=2)
    assert batch_wide.num_kept_groups == 1  # ceil(0.25 x 4)
    per_env = batch_wide.copy(copy_frozen=False).training(rollout_filter_per_env=True)
    assert per_env.num_kept_groups == 2 and per_env.kept_batch_size == 4  # ceil(0.25 x 3) + ceil(0.25 x 1)
    per_env.learners(num_learners=3)
    with pytest.raises(ValueError, match=r"keeps 2 groups .* num_learners=3"):
        per_env.validate()
    with pytest.raises(ValueError, match=r"rollout_filter_per_env='yes' must be True or False"):
        StarPOConfig().training(rollout_filter_per_env="yes").validate()
    # The kept count comes from train_envs, so a malformed entry is reported by name, not crashed on.
    with pytest.raises(ValueError, match=r"train_envs\[0\] needs 'groups'"):
        StarPOConfig().environment(train_envs=[{"env": "rllib_ragen/Sokoban-v0"}]).training(
            rollout_filter_per_env=True
        ).validate()


def test_trajectory_rewards_sit_on_the_last_sampled_token_turn_rewards_on_each_turns_last():
    # Two turns: prompt [0, 1], reply [2, 3], observation [4], reply [5, 6]; rewards -0.1 then 1.0.
    rollout = [trajectory(0, [-0.1, 1.0]), trajectory(0, [0.0, 0.0])]
    whole, _ = prepare_update_batch(rollout, config(num_groups=1, advantage_estimator="raw"), PAD)
    np.testing.assert_allclose(whole["token_rewards"][0], [0, 0, 0, 0, 0, 0, 0.9])
    per_turn, _ = prepare_update_batch(
        rollout, config(num_groups=1, advantage_estimator="raw", turn_level_rewards=True), PAD
    )
    np.testing.assert_allclose(per_turn["token_rewards"][0], [0, 0, 0, -0.1, 0, 0, 1.0])


def test_outcome_advantages_are_computed_on_the_kept_groups_and_cover_only_sampled_tokens():
    rollout = [trajectory(0, [1.0]), trajectory(0, [0.0]), trajectory(1, [2.0]), trajectory(1, [2.0])]
    cfg = config(num_groups=2, advantage_estimator="grpo", grpo_normalize_std=False)
    columns, _ = prepare_update_batch(rollout, cfg, PAD)
    # Mean-only GRPO: group 0 returns (1, 0) -> +0.5, -0.5; group 1 (2, 2) -> 0, 0. Prompt tokens get nothing.
    advantages, _ = batch_advantages(columns, cfg)
    np.testing.assert_allclose(advantages, [[0, 0, 0.5, 0.5], [0, 0, -0.5, -0.5], [0] * 4, [0] * 4])


def test_every_estimator_is_the_learners_and_a_critic_one_reads_the_values_it_is_given():
    cfg = config(num_groups=1, advantage_estimator="gae", whiten_advantages=False)
    columns, _ = prepare_update_batch([trajectory(0, [1.0]), trajectory(0, [0.0])], cfg, PAD)
    assert "advantages" not in columns  # the driver computes none: GAE needs the critic's values
    assert "advantages" not in prepare_update_batch([trajectory(0, [1.0])], config(num_groups=1), PAD)[0]
    assert ADVANTAGE_ESTIMATORS["gae"].needs_critic and StarPOConfig().model_config["value_function"]
    with pytest.raises(ValueError, match="needs the critic"):
        batch_advantages(columns, cfg)
    # gamma = lambda = 1: A_t = (rewards from t on) - V(t). Values 0.25 on every sampled token.
    values = torch.full(columns["response_mask"].shape, 0.25)
    advantages, returns = batch_advantages(columns, cfg, values=values)
    np.testing.assert_allclose(advantages, [[0, 0, 0.75, 0.75], [0, 0, -0.25, -0.25]])
    np.testing.assert_allclose(returns, [[0, 0, 1, 1], [0, 0, 0, 0]])


def test_a_registered_estimator_is_selectable_by_name_and_decides_whether_a_critic_is_built():
    def twice_the_return(inputs, settings):
        return 2 * inputs.returns[:, None] * inputs.response_mask, None

    register_advantage_estimator("twice_the_return", twice_the_return)
    try:
        cfg = config(num_groups=1, advantage_estimator="twice_the_return")
        cfg.validate()
        assert cfg.model_config["value_function"] is False
        columns, _ = prepare_update_batch([trajectory(0, [1.5]), trajectory(0, [0.0])], cfg, PAD)
        np.testing.assert_allclose(batch_advantages(columns, cfg)[0][:, 2:], [[3.0, 3.0], [0.0, 0.0]])
    finally:
        del ADVANTAGE_ESTIMATORS["twice_the_return"]
    with pytest.raises(ValueError, match="built in"):
        register_advantage_estimator("gae", twice_the_return)


def test_a_critic_estimator_refuses_to_run_without_values():
    from rllib_ragen.objectives import AdvantageInputs, AdvantageSettings

    inputs = AdvantageInputs(torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="needs the critic"):
        compute_advantages("gae", inputs, AdvantageSettings())


def test_shards_for_remote_learners_never_cut_a_group():
    # Group sizes 2, 3, 1, 2 (an environment error dropped members): two learners get groups {0, 1} and {2, 3}.
    groups = np.array([0, 0, 1, 1, 1, 2, 3, 3])
    columns = {"group": groups, "input_ids": np.arange(8)[:, None]}
    first, second = shard_by_groups(columns, 2)
    assert first["group"].tolist() == [0, 0, 1, 1, 1] and second["group"].tolist() == [2, 3, 3]
    assert np.concatenate([first["input_ids"], second["input_ids"]]).ravel().tolist() == list(range(8))


def test_kept_groups_that_do_not_split_over_the_learners_fail_at_validate():
    # 8 groups x ratio 0.375 -> 3 kept groups: not divisible by 2 learners, though 3 x 4 = 12 trajectories are.
    bad = StarPOConfig().training(num_groups=8, group_size=4, rollout_filter_ratio=0.375).learners(num_learners=2)
    with pytest.raises(ValueError, match="keeps 3 groups.*num_learners=2"):
        bad.validate()
    StarPOConfig().training(num_groups=8, group_size=4, rollout_filter_ratio=0.25).learners(num_learners=2).validate()


# One rank of a two-process gloo group (as RLlib's data-parallel learners are): the advantages of its shard.
_SHARD_WORKER = """
import json, sys
import torch, torch.distributed as dist
from rllib_ragen import StarPOConfig
from rllib_ragen.starpo.batch_advantages import batch_advantages, process_group_shards
rank, folder = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", rank=rank, world_size=2)
config = StarPOConfig().training(**json.loads(open(folder + "/knobs.json").read()))
shard = torch.load(f"{folder}/shard_{rank}.pt", weights_only=False)
advantages, _ = batch_advantages(shard, config, shards=process_group_shards("cpu"))
torch.save(advantages, f"{folder}/advantages_{rank}.pt")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("estimator", ["brpo", "gigpo"])
def test_advantages_of_two_learners_shards_are_the_whole_batchs_bit_for_bit(tmp_path, estimator):
    import json
    import os
    import socket
    import subprocess
    import sys

    # Three groups, multi-turn, states that recur within a group (GiGPO's anchors); group 2 pays all its members
    # alike, so a batch baseline computed from that shard alone would give it nothing.
    rollout = [
        trajectory(0, [0.5, 1.0]),
        trajectory(0, [0.0, 0.2]),
        trajectory(1, [1.0]),
        trajectory(1, [-0.1]),
        trajectory(2, [2.0]),
        trajectory(2, [2.0]),
    ]
    for t, states in zip(rollout, [["a", "b"], ["a", "c"], ["a"], ["a"], ["x"], ["y"]]):
        t.turn_states[:] = states
    knobs = dict(
        num_groups=3, group_size=2, rollout_filter_ratio=1.0, advantage_estimator=estimator, turn_level_rewards=True
    )
    cfg = StarPOConfig().training(**knobs)
    columns, _ = prepare_update_batch(rollout, cfg, PAD)
    whole, _ = batch_advantages(columns, cfg)
    first, second = shard_by_groups(columns, 2)  # groups {0, 1} and {2}
    # Rank 0 holds the second shard: the batch's order comes from the groups, not from which rank holds what.
    torch.save(second, tmp_path / "shard_0.pt")
    torch.save(first, tmp_path / "shard_1.pt")
    (tmp_path / "knobs.json").write_text(json.dumps(knobs))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _SHARD_WORKER, str(rank), str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True
        )
        for rank in (0, 1)
    ]
    for rank in ranks:
        _, stderr = rank.communicate(timeout=120)
        assert rank.returncode == 0, stderr[-2000:]
    got = torch.cat([torch.load(tmp_path / "advantages_1.pt"), torch.load(tmp_path / "advantages_0.pt")])
    assert whole.abs().sum() > 0 and torch.equal(got, whole)


@pytest.mark.parametrize(
    "mode, trained", [("all", [1, 1, 1, 1, 1]), ("no_think", [1, 0, 1, 1, 1]), ("answer", [0, 0, 1, 1, 0])]
)
def test_loss_mask_trains_the_chosen_reply_regions_only(mode, trained):
    from rllib_ragen.rollout.protocol import REGION_ANSWER as A, REGION_OTHER as O, REGION_THINK as T

    # Prompt [0, 1], one reply of 5 sampled tokens: <think> tag, reasoning, the answer (2 tokens), end of turn.
    rollout = [trajectory(group, [1.0 - group], reply=5) for group in (0, 0)]
    for t in rollout:
        t.token_regions = [O, O, O, T, A, A, O]
    columns, _ = prepare_update_batch(rollout, config(num_groups=1, advantage_estimator="raw", loss_mask=mode), PAD)
    np.testing.assert_array_equal(columns["loss_mask"][0], [0, 0] + trained)
    assert (columns["loss_mask"] <= columns["response_mask"]).all()  # never a token the policy did not sample


def test_rae_gives_each_row_its_roles_baseline_from_before_its_own_return():
    # SPIRAL's RAE at decay 0.5: a role's baseline starts at 0 and each trajectory, in group order, reads it and
    # then moves it halfway to its own return. Group 0 is x, o, x; group 1 is o, x, and the filter drops group 1.
    from rllib_ragen.objectives import RoleBaselines

    seats = [(0, "x", 1.0), (0, "o", -1.0), (0, "x", 0.0), (1, "o", 1.0), (1, "x", 1.0)]
    rollout = [dataclasses.replace(trajectory(g, [r]), seat=seat) for g, seat, r in seats]
    rollout = [rollout[3], rollout[0], rollout[4], rollout[1], rollout[2]]  # rollout order is not group order
    baselines = RoleBaselines(0.5)
    rae = config(rollout_filter_ratio=0.5, advantage_estimator="rae")  # group 0's std is larger: it stays
    columns, metrics = prepare_update_batch(rollout, rae, PAD, role_baselines=baselines)
    # x: 0 (reads 0, moves to 0.5), 0.5 (then 0.25); o: 0 (then -0.5); then group 1: o -0.5 (then 0.25), x 0.25
    # (then 0.625). Kept: group 0's rows, in the rollout's order within the group: x (1.0), o, x (0.0).
    assert columns["group"].tolist() == [0, 0, 0]
    assert columns["role_baseline"].tolist() == [0.0, 0.0, 0.5]
    assert baselines.values == {"test/Env-v0/x": 0.625, "test/Env-v0/o": 0.25}
    assert metrics["update/role_baseline/test/Env-v0/x"] == 0.625
    advantages, _ = batch_advantages({k: torch.as_tensor(v) for k, v in columns.items()}, rae)
    last = columns["response_mask"].sum(-1)  # every sampled token carries the trajectory's R - b
    assert advantages.sum(-1).tolist() == [1.0 * last[0], -1.0 * last[1], -0.5 * last[2]]
    # The next batch reads the baselines where this one left them; a restored state is the same.
    restored = RoleBaselines(0.5)
    restored.set_state(baselines.get_state())
    columns, _ = prepare_update_batch(rollout[:1], config(advantage_estimator="rae"), PAD, role_baselines=restored)
    assert columns["role_baseline"].tolist() == [0.25]


def test_rae_needs_its_baselines_and_a_decay_below_one():
    from rllib_ragen.objectives import AdvantageInputs, AdvantageSettings, RoleBaselines

    with pytest.raises(ValueError, match="rae_decay=1.0 must be in"):
        RoleBaselines(1.0)
    mask = torch.ones(2, 3)
    inputs = AdvantageInputs(mask, mask, torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="rae needs each trajectory's role baseline"):
        compute_advantages("rae", inputs, AdvantageSettings())
    with pytest.raises(ValueError, match="rae_decay"):
        StarPOConfig().training(advantage_estimator="rae", rae_decay=1.0).validate()
