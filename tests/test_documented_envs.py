"""Every custom environment the README and the docs show is trained, the user's next step after the example: each
page's block runs as written, then the id it registers (or the config it builds) trains one iteration in a
``StarPOConfig`` on the tiny model, through real RLlib. A page's example that only builds and steps is not enough:
registering a class object once passed ``gym.make`` and failed at ``validate()``."""

import contextlib
import io
import math
import sys

import pytest

from rllib_ragen import StarPOConfig

from tests.test_readme import _python_block_after


def smallest_run(config: StarPOConfig, num_groups: int = 1) -> StarPOConfig:
    """``config`` on the tiny model at the smallest sizes that train: ``num_groups`` groups of 2 episodes of at most
    2 turns, every trajectory kept, no scheduled validation or probe, seed 0."""
    return (
        config.rl_module(model_config={"model": "tiny"})
        .training(
            num_groups=num_groups,
            group_size=2,
            max_turns=2,
            max_new_tokens_per_turn=8,
            validation_size=2,
            validation_interval=0,
            collapse_diagnostics_interval=0,
            rollout_filter_ratio=1.0,
        )
        .debugging(seed=0)
    )


def train_one_iteration(config: StarPOConfig, trajectories: int = 2) -> dict:
    """One training iteration of ``config``'s environment at the smallest sizes that train (:func:`smallest_run`;
    ``trajectories``: what one group of 2 episodes gives, 2, or a game's seats times 2 in self-play)."""
    algo = smallest_run(config).build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    rollout = result["env_runners"]
    # Trained: both episodes came back, none was dropped by an environment error, and the learner stepped.
    assert rollout["rollout/num_trajectories"] == trajectories
    assert rollout.get("rollout/env_errors", 0.0) == 0.0
    assert result["update/kept_trajectories"] == trajectories
    assert math.isfinite(result["learners"]["default_policy"]["actor/pg_loss"])
    return result


@pytest.fixture(autouse=True)
def registrations_undone():
    """The ids a test registers are unregistered after it: the README's tests run the same blocks, each defining its
    class anew, and an id registered to another class object is refused."""
    import gymnasium as gym

    from rllib_ragen import envs

    before = set(gym.registry)
    yield
    for env_id in set(gym.registry) - before:
        del gym.registry[env_id]
        if env_id in envs._TEXT_ENV_IDS:
            envs._TEXT_ENV_IDS.remove(env_id)


def run_block(name: str, namespace: dict | None = None) -> dict:
    namespace = {} if namespace is None else namespace
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(_python_block_after(name), f"docs {name}", "exec"), namespace)
    return namespace


def test_the_custom_environment_trains_registered_as_a_class(ray_session, forget_registration):
    forget_registration("my_project/Countdown-v0")
    run_block("custom-env")  # registers my_project/Countdown-v0 with the class object, as the page does
    train_one_iteration(StarPOConfig().environment("my_project/Countdown-v0"))


def test_the_custom_environment_trains_registered_by_import_path(ray_session, tmp_path, monkeypatch):
    import rllib_ragen

    # The page's class, in a module of the user's project, registered by its import path.
    code = _python_block_after("custom-env").split("rllib_ragen.register_text_env(")[0]
    (tmp_path / "my_countdown.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    rllib_ragen.register_text_env("my_project/CountdownByPath-v0", "my_countdown:Countdown", max_episode_steps=20)
    try:
        train_one_iteration(StarPOConfig().environment("my_project/CountdownByPath-v0"))
    finally:
        sys.modules.pop("my_countdown", None)


def test_the_tool_environment_trains(ray_session):
    run_block("tool-env")  # registers my_project/Vault-v0
    train_one_iteration(StarPOConfig().environment("my_project/Vault-v0"))


def test_the_trl_environment_trains(ray_session):
    train_one_iteration(run_block("trl-env")["config"])


@pytest.mark.parametrize("protocol", ["rllib_ragen", "openenv"])
def test_the_served_environment_trains(ray_session, env_server, protocol):
    if protocol == "openenv":
        pytest.importorskip("openenv")  # the test extra installs it
    flags = ("--protocol", "openenv") if protocol == "openenv" else ()
    block = "openenv-remote" if protocol == "openenv" else "remote-env"
    with env_server("rllib_ragen/Sokoban-v0", *flags) as server:
        code = _python_block_after(block).replace("http://127.0.0.1:8000", server.url)
        namespace = {}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"docs {block}", "exec"), namespace)
        train_one_iteration(namespace["config"])


def test_the_multi_agent_pages_seat_env_trains(ray_session):
    train_one_iteration(run_block("seat-env")["config"].training(max_actions_per_turn=1))
