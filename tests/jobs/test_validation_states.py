"""Validation states described for reporting: optimal solution length (Sokoban, checked against the solver and a
hand-drawn level) and whether a training seed drew the same initial state."""

from rllib_ragen.envs.sokoban_levels import SokobanLevel, solve_level
from rllib_ragen.jobs.validation_states import initial_states

import gymnasium as gym


def test_sokoban_optimal_solution_length_by_hand_and_by_the_solver():
    env = gym.make("rllib_ragen/Sokoban-v0")
    # The player pushes the box right onto the target: one move; from one cell further left, two.
    for row, moves in (("#PXO_#", 1), ("#P_XO#", 2)):
        level = SokobanLevel.from_text("\n".join(["######", row, "#____#", "#____#", "#____#", "######"]))
        env.reset(options={"level": level})
        assert env.unwrapped.optimal_solution_length() == moves
    env.reset(seed=5)
    assert env.unwrapped.optimal_solution_length() == len(solve_level(env.unwrapped.level))
    env.step("Right")  # from the current position, not the level's start
    assert env.unwrapped.optimal_solution_length() == len(
        solve_level(
            SokobanLevel(
                6,
                env.unwrapped.level.floor,
                env.unwrapped.level.targets,
                frozenset(env.unwrapped.boxes),
                env.unwrapped.player,
            )
        )
    )


def test_initial_states_match_across_seeds_that_draw_the_same_level():
    states = initial_states("rllib_ragen/Sokoban-v0", {}, range(123, 123 + 64), solution_lengths=True)
    assert all(length is not None and length >= 1 for _, length in states.values())
    again = initial_states("rllib_ragen/Sokoban-v0", {}, [123])
    assert again[123] == (states[123][0], None)  # the same key; no solving unless asked
    # The 6x6 one-box level space is small: among 2,000 training seeds some draw a validation level.
    training = {key for key, _ in initial_states("rllib_ragen/Sokoban-v0", {}, range(10_000, 12_000)).values()}
    seen = [seed for seed, (key, _) in states.items() if key in training]
    assert 0 < len(seen) < len(states)
    # FrozenLake has no solver here: lengths stay None.
    assert {length for _, length in initial_states("rllib_ragen/FrozenLake-v0", {}, [1, 2], True).values()} == {None}


def test_the_seeds_each_training_environment_saw_are_read_off_the_schedule():
    from rllib_ragen import StarPOConfig
    from rllib_ragen.jobs.validation_states import trained_seeds_by_env

    # Two steps of 3 groups: Sokoban takes the first 2 seeds of each step, FrozenLake the third.
    mixture = StarPOConfig().environment(
        train_envs=[{"env": "rllib_ragen/Sokoban-v0", "groups": 2}, {"env": "rllib_ragen/FrozenLake-v0", "groups": 1}]
    )
    mixture.training(num_groups=3, train_seed_start=100)
    assert trained_seeds_by_env(mixture, next_train=106) == {
        "rllib_ragen/Sokoban-v0": [100, 101, 103, 104],
        "rllib_ragen/FrozenLake-v0": [102, 105],
    }
    single = StarPOConfig().training(num_groups=3, train_seed_start=100)
    assert trained_seeds_by_env(single, next_train=106) == {"rllib_ragen/Sokoban-v0": list(range(100, 106))}
