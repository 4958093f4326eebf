"""Other packages' games and served environments train like the built-in ones: in a mixture, on a remote env runner,
validated beside an environment served over HTTP by a real server process."""

import pytest

from rllib_ragen.envs import make_text_env

GUESS, MASTERMIND = "gem/game.GuessTheNumber-v0-easy", "textarena/Mastermind-v0-train"
REMOTE = "rllib_ragen/Remote-v0"


@pytest.mark.slow
def test_adapted_and_served_games_train_in_a_mixture_on_a_remote_runner(ray_session, small_config, env_server):
    pytest.importorskip("gem")
    pytest.importorskip("textarena")
    with env_server("rllib_ragen/Countdown-v0") as server:
        # Short: GEM's instructions alone are ~500 tokens of the tiny tokenizer's.
        config = small_config(validation_interval=1, group_size=2, max_turns=2, max_new_tokens_per_turn=6)
        config.environment(
            train_envs=[{"env": GUESS, "groups": 1}, {"env": MASTERMIND, "groups": 1}],
            validation_envs=[
                {"env": GUESS, "states": 2},
                {"env": REMOTE, "env_config": {"url": server.url}, "name": "countdown-served", "states": 2},
            ],
        )
        algo = config.env_runners(num_env_runners=1).build_algo()
        try:
            result = algo.train()
            validation = list(algo.last_validation)
        finally:
            algo.stop()
    for name in (GUESS, MASTERMIND):  # one group of 2 episodes of each, played on the remote runner
        assert result["env_runners"][f"{name}/num_trajectories"] == 2
    evaluation = result["evaluation"]["env_runners"]
    for name in (GUESS, "countdown-served"):
        assert evaluation[f"{name}/num_trajectories"] == 2
    assert result["env_runners"]["rollout/env_errors"] == 0.0
    served = [t for t in validation if t.env_name == "countdown-served"]
    # The served episodes are the in-process game's: the same first state for the same seed.
    assert [t.seed for t in served] == [123, 124]
    assert make_text_env("rllib_ragen/Countdown-v0").reset(seed=123)[0] in served[0].text
