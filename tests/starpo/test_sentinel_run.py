"""The echo-trap probe and the sentinel inside real StarPO runs (tiny model, real learner and env runner)."""

import json

import pytest
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback

from rllib_ragen import StarPO
from rllib_ragen import metrics as M
from rllib_ragen.sentinel import Rule
from rllib_ragen.starpo.sentinel_actions import SentinelActions

pytestmark = pytest.mark.usefixtures("ray_session")

# Holds at every iteration: the rule's patience alone decides when it fires.
ALWAYS = dict(signal=M.FILTER_REWARD_STD, kind="below", threshold=1e9, warmup=1)


def policy_after(config, iterations: int) -> dict[str, torch.Tensor]:
    algo = config.build_algo()
    try:
        for _ in range(iterations):
            result = algo.train()
        return {k: v.clone() for k, v in algo.policy_weights().items()}, result
    finally:
        algo.stop()


def test_the_probe_reports_every_signal_and_leaves_training_unchanged(small_config):
    probed, result = policy_after(
        small_config(collapse_diagnostics_interval=1, gradient_analysis_interval=1, validation_interval=0), 2
    )
    plain, plain_result = policy_after(small_config(collapse_diagnostics_interval=0, validation_interval=0), 2)
    assert all(torch.equal(probed[k], plain[k]) for k in plain)  # weights, optimizer and RNG untouched by the probe
    for name in (
        M.RETRIEVAL_ACCURACY,
        M.MI_ESTIMATE,
        M.CROSS_SCORE_MARGIN,
        M.TIME_COLLAPSE_PROBE,
        M.THINK_TOKENS_PER_TURN,
        M.DISTINCT_2,
        M.REPEAT_RATE,
    ):
        assert name in result, name
    assert 0.0 <= result[M.RETRIEVAL_ACCURACY] <= 1.0
    assert any(k.startswith("collapse/grad_norm_") for k in result)
    # Shares of the groups in the three reward-variance buckets sum to one.
    assert sum(result[M.BUCKET_SHARE.format(bucket=b)] for b in ("zero", "low", "high")) == pytest.approx(1.0)
    assert M.MI_ESTIMATE not in plain_result and M.DISTINCT_2 in plain_result  # the cheap ones run always


def test_the_gradient_analysis_rides_on_the_first_probe_of_each_window(small_config):
    """Iterations 0-4 with collapse_diagnostics_interval=2 and gradient_analysis_interval=3: the probe runs at 0, 2
    and 4; the buckets' gradient norms with its first run in each window of 3 iterations, at 0 and 4 (3 has no
    probe). With the probe off nothing of it runs (the default gradient interval does not switch it back on)."""
    algo = small_config(
        collapse_diagnostics_interval=2, gradient_analysis_interval=3, validation_interval=0
    ).build_algo()
    calls, probe = [], algo._collapse_probe

    def recorded(columns, trajectories, gradient_norms):
        calls.append((algo.iteration, gradient_norms))
        metrics = probe(columns, trajectories, gradient_norms)
        assert M.RETRIEVAL_ACCURACY in metrics
        assert any(k.startswith("collapse/grad_norm_") for k in metrics) == gradient_norms
        assert sum(metrics[M.BUCKET_SHARE.format(bucket=b)] for b in ("zero", "low", "high")) == pytest.approx(1)
        return metrics

    algo._collapse_probe = recorded
    try:
        for _ in range(5):
            algo.train()
    finally:
        algo.stop()
    assert calls == [(0, True), (2, False), (4, True)]
    off = small_config(collapse_diagnostics_interval=0, validation_interval=0).build_algo()
    off._collapse_probe = lambda *args: pytest.fail("the probe ran with collapse_diagnostics_interval=0")
    try:
        off.train()
    finally:
        off.stop()


def test_a_rollback_restores_the_last_healthy_weights_lowers_the_lr_and_survives_a_checkpoint(tmp_path, small_config):
    rule = Rule(**ALWAYS, patience=2, action="rollback", knobs={"lr_factor": 0.5}, name="always")
    twin = Rule(**ALWAYS, patience=2, action="rollback", knobs={"lr_factor": 0.5}, name="always too")
    algo = small_config(
        sentinel_rules=[rule, twin], validation_interval=0, collapse_diagnostics_interval=0
    ).build_algo()
    try:
        algo.train()  # iteration 1: warm-up value, healthy: the rollback point
        healthy = {k: v.clone() for k, v in algo.policy_weights().items()}
        second = algo.train()  # holds once
        assert second[M.SENTINEL_FIRINGS] == 0
        assert not all(torch.equal(healthy[k], v) for k, v in algo.policy_weights().items())
        third = algo.train()  # holds twice: rollback
        events = json.loads(third[M.SENTINEL_EVENTS])
        assert [e["action"] for e in events] == ["rollback", "rollback"] and events[0]["iteration"] == 3
        assert "restored the weights and optimizer state of iteration 1" in events[0]["done"]
        assert events[1]["done"] == "covered by this iteration's rollback"  # one rollback, one halving
        assert third[M.SENTINEL_ROLLBACKS] == 1 and third[M.SENTINEL_LR_FACTOR] == 0.5
        after = algo.policy_weights()
        assert all(torch.equal(healthy[k], after[k]) for k in healthy)
        # The env runner plays the restored weights.
        runner = algo.env_runner.module.policy_state(algo.env_runner.module.get_state())
        assert all(torch.equal(after[k], runner[k]) for k in after)
        lrs = lambda a: [g["lr"] for o in a.learner_group._learner._named_optimizers.values() for g in o.param_groups]
        assert lrs(algo) == pytest.approx([0.5e-3, 0.5e-3])
        algo.train()  # RLlib resets each lr after an update: the factor must hold
        assert lrs(algo) == pytest.approx([0.5e-3, 0.5e-3])
        algo.save_to_path(tmp_path / "checkpoint")
        restored = StarPO.from_checkpoint(tmp_path / "checkpoint")
        try:
            assert restored.sentinel.lr_factor == 0.5 and restored.sentinel.rollbacks == 1
            assert [f.rule for f in restored.sentinel.firings] == ["always", "always too"]
            assert lrs(restored) == pytest.approx([0.5e-3, 0.5e-3])
        finally:
            restored.stop()
    finally:
        algo.stop()


@pytest.mark.slow
def test_a_stop_rule_ends_a_tune_trial(tmp_path, small_config):
    from ray import tune

    rule = Rule(**ALWAYS, patience=1, action="stop", name="stop at once")
    results = tune.Tuner(
        StarPO,
        param_space=small_config(sentinel_rules=[rule], validation_interval=0, collapse_diagnostics_interval=0),
        run_config=tune.RunConfig(stop={"training_iteration": 5}, storage_path=str(tmp_path), verbose=0),
    ).fit()
    # Warm-up at iteration 1, fires (stop) at iteration 2: the trial ends there, not at 5.
    assert not results.errors
    assert results[0].metrics["training_iteration"] == 2 and results[0].metrics[M.SENTINEL_STOP] == 1.0


@pytest.mark.slow
def test_probe_and_rollback_with_a_remote_learner_and_a_remote_env_runner(small_config):
    rule = Rule(**ALWAYS, patience=2, action="rollback", knobs={"lr_factor": 0.5}, name="always")
    algo = (
        small_config(sentinel_rules=[rule], validation_interval=0, collapse_diagnostics_interval=1)
        .env_runners(num_env_runners=1)
        .learners(num_learners=1)
        .build_algo()
    )
    try:
        first = algo.train()
        assert 0.0 <= first[M.RETRIEVAL_ACCURACY] <= 1.0  # the probe ran on the remote learner
        healthy = {k: v.clone() for k, v in algo.policy_weights().items()}
        algo.train()
        third = algo.train()
        assert third[M.SENTINEL_ROLLBACKS] == 1
        restored = algo.policy_weights()
        assert all(torch.equal(healthy[k], restored[k]) for k in healthy)
        # The remote env runner plays the restored weights, not the collapsed ones it held.
        remote = algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.module.policy_state(runner.module.get_state()), local_env_runner=False
        )[0]
        assert all(torch.equal(restored[k], remote[k]) for k in restored)
        lrs = algo.learner_group.foreach_learner(
            lambda learner: [g["lr"] for o in learner._named_optimizers.values() for g in o.param_groups]
        )
        assert next(iter(lrs)).get() == pytest.approx([0.5e-3, 0.5e-3])
    finally:
        algo.stop()


class _SeesTheSentinel(RLlibCallback):
    """A user's callback: what the sentinel had added to each result when this one saw it."""

    firings: list = []

    def on_train_result(self, *, algorithm, result, **kwargs):
        _SeesTheSentinel.firings.append(result.get(M.SENTINEL_FIRINGS))


def test_the_sentinel_is_an_rllib_callback_ahead_of_the_users_own(small_config):
    rule = Rule(**ALWAYS, patience=1, action="warn", name="warn at once")
    config = small_config(sentinel_rules=[rule], validation_interval=0, collapse_diagnostics_interval=0)
    algo = config.callbacks(_SeesTheSentinel).build_algo()
    try:
        results = [algo.train(), algo.train()]  # warm-up, then it fires
        assert isinstance(algo.callbacks[0], SentinelActions)
    finally:
        algo.stop()
    assert _SeesTheSentinel.firings == [0.0, 1.0] == [r[M.SENTINEL_FIRINGS] for r in results]
