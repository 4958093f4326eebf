"""Shared fixtures: one Ray session for every test that needs Ray (starting it takes ~5 s and ~700 MiB), and a
StarPO config sized for a 2-core CPU."""

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture
def ray_session():
    """A one-node Ray of 2 CPUs, shared by the tests (started by the first that needs it, and again after a test
    that ran a multi-node cluster of its own). Ray stops when pytest exits."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


@pytest.fixture
def small_config():
    return make_small_config


def make_small_config(env="rllib_ragen/Sokoban-v0", **training):
    """A StarPO config sized for a 2-core CPU test: 2 groups x 4 episodes, short replies, tiny model. The echo-trap
    probe is off (it would run at every algorithm's first iteration); its tests switch it on."""
    from rllib_ragen import StarPOConfig

    knobs = dict(num_groups=2, group_size=4, max_new_tokens_per_turn=12, max_turns=2, validation_size=4,
                 validation_interval=2, lr=1e-3, critic_lr=1e-3, rollout_filter_ratio=0.5,
                 collapse_diagnostics_interval=0)
    knobs.update(training)
    return (StarPOConfig().environment(env).rl_module(model_config={"model": "tiny"}).training(**knobs)
            .debugging(seed=7))


@pytest.fixture
def resumed_after_one_iteration():
    return restore_after_one_iteration


def restore_after_one_iteration(build, directory):
    """``build()`` an algorithm, train one iteration, checkpoint it under ``directory`` and return the algorithm
    restored from that checkpoint (the caller stops it): the first half of every exact-resume test."""
    from rllib_ragen import StarPO

    first = build()
    try:
        first.train()
        checkpoint = first.save_to_path(directory / "checkpoint")
    finally:
        first.stop()
    return StarPO.from_checkpoint(checkpoint)


def learner_module_state(algo) -> dict:
    """A copy of the local learner's module state (policy and critic): compared bit for bit after a resume."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    return {k: v.clone() for k, v in algo.learner_group._learner.module[DEFAULT_MODULE_ID].get_state().items()}


@pytest.fixture
def learner_state():
    return learner_module_state
