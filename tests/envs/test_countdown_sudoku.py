"""Countdown (multi-turn) and 4x4 Sudoku: rules, generators and solvers, with hand-derived cases."""

from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest

import rllib_ragen  # noqa: F401  (registers the environments)
from rllib_ragen.envs.countdown import evaluate, solve
from rllib_ragen.envs.sudoku import fits, generate_puzzle, solutions


def test_countdown_evaluates_exactly_and_refuses_anything_but_arithmetic():
    assert evaluate("(6 - 2) * 5") == (20, [6, 2, 5])
    assert evaluate("7 / 2") == (Fraction(7, 2), [7, 2])  # exact, not 3.5000000001 or 3
    for bad in ("3 / (2 - 2)", "2 ** 3", "-3 + 5", "1 +", "(" * 300 + "1" + ")" * 300):
        with pytest.raises(ValueError):
            evaluate(bad)


def test_countdown_solver_uses_each_number_once_and_knows_when_there_is_none():
    assert solve([2, 3], 7) is None  # 5, -1, 6, 2/3, ...: never 7
    assert solve([4, 4], 1) == "4 / 4"
    for numbers, target in (([1, 6, 15], 90), ([3, 7, 9, 12], 24), ([5, 5, 5], 125)):
        value, used = evaluate(solve(numbers, target))
        assert value == target and sorted(used) == sorted(numbers)


def test_countdown_plays_over_turns_with_feedback():
    env = gym.make("rllib_ragen/Countdown-v0")
    obs, _ = env.reset(seed=0, options={"numbers": [1, 6, 15], "target": 90})
    assert obs == "Numbers: 1, 6, 15. Target: 90."
    obs, reward, terminated, _, info = env.step("1 + 6 + 15")
    assert (reward, terminated, info["action_is_effective"]) == (0.0, False, True)
    assert obs.endswith("Last attempt: 1 + 6 + 15 = 22, 68 away from 90.")
    obs, _, _, _, info = env.step("6 * 15")  # 1 unused: told so, nothing counts
    assert not info["action_is_effective"] and "not each of [1, 6, 15] exactly once" in obs
    assert env.step("six times fifteen")[4]["action_is_valid"] is False  # no expression: the protocol's penalty
    obs, reward, terminated, _, info = env.step("15 * 6 / 1")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


@pytest.mark.parametrize("bad", [{"num_numbers": 5}, {"num_numbers": True}, {"max_target": 0}, {"max_number": 2.5}])
def test_countdown_refuses_sizes_it_cannot_draw_puzzles_for(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        gym.make("rllib_ragen/Countdown-v0", **bad)


def test_countdown_puzzles_are_solvable_with_targets_in_range():
    for num_numbers in (3, 4):
        env = gym.make("rllib_ragen/Countdown-v0", num_numbers=num_numbers)
        for seed in range(100):
            env.reset(seed=seed)
            assert 1 <= env.unwrapped.target <= 100 and len(env.unwrapped.numbers) == num_numbers
            assert env.step(env.unwrapped.solution())[1] == 1.0


def test_sudoku_puzzles_have_one_solution_and_the_requested_gaps():
    for seed in range(200):
        puzzle, solution = generate_puzzle(np.random.default_rng(seed), num_empty=6)
        assert (puzzle == 0).sum() == 6 and np.array_equal(puzzle[puzzle > 0], solution[puzzle > 0])
        for line in [*solution, *solution.T, *(solution[r : r + 2, c : c + 2].ravel() for r in (0, 2) for c in (0, 2))]:
            assert sorted(line) == [1, 2, 3, 4]
        (only,) = solutions(puzzle)
        assert np.array_equal(only, solution)


def test_sudoku_refuses_filled_cells_and_clashes_and_pays_only_the_last_move():
    grid = np.array([[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 0]])
    assert fits(grid, 3, 3, 1) and not fits(grid, 3, 3, 2)  # 2 is in row 4 already
    env = gym.make("rllib_ragen/Sudoku4x4-v0")
    obs, _ = env.reset(seed=1)
    game = env.unwrapped
    filled = tuple(int(i) + 1 for i in np.argwhere(game.grid > 0)[0])
    assert env.step(f"{filled[0]} {filled[1]} 1")[4]["action_is_effective"] is False
    moves = game.solution_moves()
    r, c, d = (int(n) for n in moves[0].split())
    clash = next(x for x in range(1, 5) if not fits(game.grid, r - 1, c - 1, x))
    assert env.step(f"{r} {c} {clash}")[4]["action_is_effective"] is False
    rewards = [env.step(move.replace(" ", "  "))[1] for move in moves]  # spacing does not matter
    assert rewards == [0.0] * (len(moves) - 1) + [1.0] and game.success
