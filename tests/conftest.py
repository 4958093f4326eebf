"""Shared fixtures: one Ray session for every test that needs Ray (starting it takes ~5 s and ~700 MiB), and a
StarPO config sized for a 2-core CPU, and environment servers on 127.0.0.1."""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
TESTS = pathlib.Path(__file__).parent


@pytest.fixture
def ray_session():
    """A one-node Ray of 2 CPUs, shared by the tests (started by the first that needs it, and again after a test
    that ran a multi-node cluster of its own). Ray stops when pytest exits."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


@pytest.fixture
def forget_registration():
    """Call it with an id the test registers: the id is unregistered after the test. A documented block that defines
    and registers a class (the custom environment of the README and the Environments page) runs in more than one
    test, and each run defines a new class, which the registry rightly refuses under the same id."""
    import gymnasium as gym

    from rllib_ragen import envs

    ids: list[str] = []
    yield ids.append
    for env_id in ids:
        gym.registry.pop(env_id, None)
        if env_id in envs._TEXT_ENV_IDS:
            envs._TEXT_ENV_IDS.remove(env_id)


@pytest.fixture
def small_config():
    return make_small_config


def make_small_config(env="rllib_ragen/Sokoban-v0", **training):
    """A StarPO config sized for a 2-core CPU test: 2 groups x 4 episodes, short replies, tiny model. The echo-trap
    probe is off (it would run at every algorithm's first iteration); its tests switch it on."""
    from rllib_ragen import StarPOConfig

    knobs = dict(
        num_groups=2,
        group_size=4,
        max_new_tokens_per_turn=12,
        max_turns=2,
        validation_size=4,
        validation_interval=2,
        lr=1e-3,
        critic_lr=1e-3,
        rollout_filter_ratio=0.5,
        collapse_diagnostics_interval=0,
    )
    knobs.update(training)
    return StarPOConfig().environment(env).rl_module(model_config={"model": "tiny"}).training(**knobs).debugging(seed=7)


@pytest.fixture(scope="session")
def warm_bandit_model(tmp_path_factory):
    """The tiny model fine-tuned on 256 bandit demonstrations that pick an arm at random (no preference taught): its
    replies are well formed and its pulls' payoffs differ, so an update has a signal to carry. The untrained tiny model
    earns every episode the same format penalty, which leaves every advantage zero."""
    import numpy as np

    from rllib_ragen.demonstrators import random_arm_policy
    from rllib_ragen.rollout import RolloutConfig, load_policy
    from rllib_ragen.warm_start import collect_demonstrations, supervised_warm_start

    model, tokenizer = load_policy("tiny", seed=0)
    demos = collect_demonstrations(
        RolloutConfig(env="rllib_ragen/Bandit-v0", max_turns=1), random_arm_policy(seed=0), tokenizer, 256
    )
    assert 0.4 < np.mean([t.success for t in demos]) < 0.6  # the demonstrations really are indifferent
    losses = supervised_warm_start(model, demos, steps=60, batch_size=16, lr=2e-3, pad_token_id=tokenizer.pad_token_id)
    assert losses[-1] < 0.1 * losses[0]
    path = tmp_path_factory.mktemp("warm_bandit")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def bandit_config(warm_bandit_model):
    """small_config on the bandit with ``warm_bandit_model``, whose pulls earn different payoffs: the test data for
    updates compared across learner layouts with an estimator that needs returns to differ (GRPO, a batch
    baseline). Replies of up to 32 tokens, as the model was fine-tuned on."""
    return lambda **training: make_small_config(
        env="rllib_ragen/Bandit-v0", max_turns=1, max_new_tokens_per_turn=32, **training
    ).rl_module(model_config={"model": warm_bandit_model})


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


@pytest.fixture(scope="session")  # a function, stateless: module fixtures may share one server through it
def env_server():
    """Start an environment server process on 127.0.0.1 (``python -m rllib_ragen.envs.remote.server``): ``with
    env_server(env_id, *flags, port=0) as server:`` gives it with ``server.url``, and stops it (SIGTERM, then kill)
    at the end of the block; ``server.stop()`` stops it earlier. It can serve the test environments of
    ``tests/envs/served_envs.py``."""
    return _serving


@contextlib.contextmanager
def _serving(env_id, *flags, port=0):
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS / "envs"), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rllib_ragen.envs.remote.server",
            "--env",
            env_id,
            "--port",
            str(port),
            "--register",
            "served_envs",
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=environ,
    )
    process.stop = lambda: _stop(process)
    try:
        line = process.stdout.readline()  # "serving ID on http://127.0.0.1:PORT", once it listens
        assert line.startswith("serving"), f"the server did not start: {line!r}"
        process.url = line.split(" on ")[1].split()[0]
        yield process
    finally:
        _stop(process)


def _stop(process):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
