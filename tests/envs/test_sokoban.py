import collections

import gymnasium as gym
import numpy as np
import pytest

import rllib_ragen  # noqa: F401
from rllib_ragen.envs import SokobanLevel, generate_level, solve_level
from rllib_ragen.envs.sokoban_levels import move_effects
from rllib_ragen.envs.sokoban import SYMBOL_SETS

# Box one push left of a target, player left of the box.
LINE = """\
######
#PX_O#
#____#
#____#
#____#
######"""


def _env_with(level_text, **kwargs):
    env = gym.make("rllib_ragen/Sokoban-v0", **kwargs)
    level = SokobanLevel.from_text(level_text)
    obs, _ = env.reset(seed=0, options={"level": level})
    return env, obs


def test_rewards_for_walk_wall_push_and_solve():
    env, obs = _env_with(LINE)
    assert obs == LINE
    # Bump into the wall: step penalty only, nothing changes.
    obs, r, term, _, info = env.step("Up")
    assert (obs, r, term, info["action_is_effective"]) == (LINE, -0.1, False, False)
    # Push the box one cell (not yet on the target): -0.1.
    obs, r, term, _, info = env.step("Right")
    assert r == pytest.approx(-0.1) and not term and info["action_is_effective"]
    assert obs.splitlines()[1] == "#_PXO#"
    # Push it onto the target: -0.1 + 1 + 10 = 10.9, and the episode ends with success.
    obs, r, term, _, info = env.step("right")
    assert r == pytest.approx(10.9) and term and info["success"]
    assert obs.splitlines()[1] == "#__P√#"


def test_pushing_a_box_off_a_target_costs_one():
    level = """\
######
#____#
#XO__#
#_√P_#
#____#
######"""
    env, _ = _env_with(level)
    # Push the box on (3,2) left, off its target onto floor: -0.1 - 1; the player now stands on that target.
    obs, r, _, _, _ = env.step("Left")
    assert r == pytest.approx(-1.1)
    assert obs.splitlines()[3] == "#XS__#"
    # A box cannot be pushed into a wall: step penalty, nothing changes.
    obs2, r, _, _, info = env.step("Left")
    assert r == pytest.approx(-0.1) and obs2 == obs and not info["action_is_effective"]


def test_success_reward_pays_only_the_solving_move():
    env, _ = _env_with(LINE, reward="success")
    steps = [env.step(a) for a in ("Up", "Right", "Right")]  # wall bump, push, push onto the target
    assert [r for _, r, _, _, _ in steps] == [0.0, 0.0, 1.0]
    assert [term for _, _, term, _, _ in steps] == [False, False, True] and steps[-1][4]["success"]
    # The same moves under the shaped reward end in the same state: only the payout differs.
    shaped, _ = _env_with(LINE)
    assert [shaped.step(a)[0] for a in ("Up", "Right", "Right")] == [obs for obs, *_ in steps]
    with pytest.raises(ValueError, match="reward='sparse'"):
        gym.make("rllib_ragen/Sokoban-v0", reward="sparse")


def test_distance_shaping_pays_each_cell_of_progress_and_adds_up_to_the_potential_difference():
    # LINE: the box 2 cells from its target, the player 1 from the box: phi = -3. Hand-derived, w = 0.5:
    # Up bumps the wall (phi stays); Down walks away from the box (phi -4, -w); Up walks back (+w); Right
    # pushes the box 1 cell closer, the player stays next to it (phi -2, +w); Right solves it (phi 0, +2w and 1).
    env, _ = _env_with(LINE, reward="success", distance_shaping=0.5)
    assert env.unwrapped.distance_potential() == -3.0
    rewards = [env.step(a)[1] for a in ("Up", "Down", "Up", "Right", "Right")]
    assert rewards == [0.0, -0.5, 0.5, 0.5, 2.0]
    assert env.unwrapped.distance_potential() == 0.0
    # Beside RAGEN's shaped reward the same terms add on: the solving push pays -0.1 + 1 + 10 + 2w.
    env, _ = _env_with(LINE, distance_shaping=0.5)
    assert [env.step(a)[1] for a in ("Right", "Right")] == pytest.approx([-0.1 + 0.5, 10.9 + 1.0])
    # Off by default: the rewards of the test above.
    env, _ = _env_with(LINE, reward="success")
    assert [env.step(a)[1] for a in ("Down", "Up", "Right", "Right")] == [0.0, 0.0, 0.0, 1.0]
    for bad in (-0.1, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="distance_shaping=.* must be a finite number >= 0"):
            gym.make("rllib_ragen/Sokoban-v0", distance_shaping=bad)


def test_distance_shaping_of_an_episode_telescopes_on_generated_levels():
    """Whatever the moves, an episode's shaping is w * (phi(end) - phi(start)): potential-based."""
    rng = np.random.default_rng(0)
    for seed in range(20):
        plain = gym.make("rllib_ragen/Sokoban8x8TwoBoxes-v0", reward="success")
        shaped = gym.make("rllib_ragen/Sokoban8x8TwoBoxes-v0", reward="success", distance_shaping=0.25)
        plain.reset(seed=seed)
        shaped.reset(seed=seed)
        start, extra = shaped.unwrapped.distance_potential(), 0.0
        for move in rng.choice(["Up", "Down", "Left", "Right"], size=30):
            _, r_plain, term, trunc, _ = plain.step(str(move))
            _, r_shaped, *_ = shaped.step(str(move))
            extra += r_shaped - r_plain
            if term or trunc:
                break
        assert extra == pytest.approx(0.25 * (shaped.unwrapped.distance_potential() - start))


def test_alternate_symbols_draw_the_same_level():
    default = gym.make("rllib_ragen/Sokoban-v0").reset(seed=11)[0]
    alternate = gym.make("rllib_ragen/SokobanAltSymbols-v0").reset(seed=11)[0]
    table = {SYMBOL_SETS["default"][k]: SYMBOL_SETS["alternate"][k] for k in SYMBOL_SETS["default"]}
    assert "".join(table.get(ch, ch) for ch in default) == alternate


def test_coordinates_name_the_same_level_cell_by_cell():
    # LINE with a wall inside: (row, column) from 0; the border walls are not listed one by one.
    level = SokobanLevel.from_text(LINE.replace("#____#\n#____#\n######", "#_#__#\n#____#\n######"))
    assert level.to_coordinates() == (
        "Board size: 6 rows x 6 cols (zero-indexed).\n"
        "Walls: the border, and (3, 2)\n"
        "Targets: (1, 4)\nBoxes: (1, 2)\nPlayer: (1, 1)"
    )
    parsed = SokobanLevel.from_text(level.to_coordinates())
    assert (parsed.targets, parsed.boxes, parsed.player) == (level.targets, level.boxes, level.player)
    assert np.array_equal(parsed.floor, level.floor)
    # The coordinate variant plays the grid variant's levels with the same rewards, move for move.
    grid, coordinates = gym.make("rllib_ragen/Sokoban-v0"), gym.make("rllib_ragen/SokobanCoordinates-v0")
    for seed in range(20):
        grid.reset(seed=seed)
        obs, _ = coordinates.reset(seed=seed)
        for move in ["Up", "Left", "Down", "Right"] * 2:
            step_grid, (obs, *step_coordinates) = grid.step(move), coordinates.step(move)
            assert step_grid[1:] == tuple(step_coordinates)
            shown, drawn = SokobanLevel.from_text(obs), SokobanLevel.from_text(step_grid[0])
            assert (shown.boxes, shown.player, shown.targets) == (drawn.boxes, drawn.player, drawn.targets)
            assert np.array_equal(shown.floor, drawn.floor)
    env, obs = _env_with(LINE, render="coordinates")
    assert env.step("Right")[0].endswith("Boxes: (1, 3)\nPlayer: (1, 2)")


def test_solver_is_optimal_on_known_levels():
    assert solve_level(SokobanLevel.from_text(LINE)) == ["Right", "Right"]
    # The box must be pushed from below: Down, Left (2 moves) puts the player under it, then Up, Up = 4.
    level = SokobanLevel.from_text("""\
######
#_O__#
#____#
#_XP_#
#____#
######""")
    solution = solve_level(level)
    assert solution == ["Down", "Left", "Up", "Up"]


def test_solver_reports_unsolvable_levels():
    # Box in a corner that is not a target: dead.
    assert (
        solve_level(
            SokobanLevel.from_text("""\
######
#X___#
#____#
#__P_#
#___O#
######""")
        )
        is None
    )


def test_from_text_rejects_bad_levels():
    with pytest.raises(ValueError, match="square"):
        SokobanLevel.from_text("###\n#P#")
    with pytest.raises(ValueError, match="border"):
        SokobanLevel.from_text("_###\n#PX#\n#O_#\n####")
    with pytest.raises(ValueError, match="symbol"):
        SokobanLevel.from_text("####\n#PZ#\n#O_#\n####")


@pytest.mark.parametrize("dim, num_boxes", [(6, 1), (8, 2)])
def test_thousand_generated_levels_are_all_solved(dim, num_boxes):
    lengths = []
    for seed in range(1000):
        level = generate_level(np.random.default_rng(seed), dim=dim, num_boxes=num_boxes)
        assert len(level.boxes) == num_boxes and level.boxes.isdisjoint(level.targets)
        solution = solve_level(level)
        assert solution, f"seed {seed}: generated level has no solution"
        lengths.append(len(solution))
    counts = sorted(collections.Counter(lengths).items())
    print(
        f"\n{dim}x{dim}/{num_boxes} box(es): optimal length mean {np.mean(lengths):.2f}, "
        f"within 10 actions {np.mean(np.array(lengths) <= 10):.1%}, distribution {counts}"
    )


@pytest.mark.parametrize("env_id", ["rllib_ragen/Sokoban-v0", "rllib_ragen/Sokoban8x8TwoBoxes-v0"])
def test_solver_solutions_solve_the_env(env_id):
    env = gym.make(env_id)
    for seed in range(50):
        env.reset(seed=seed)
        solution = solve_level(env.unwrapped.level)
        for i, action in enumerate(solution):
            _, _, terminated, _, info = env.step(action)
            assert terminated == (i == len(solution) - 1) == info["success"]


def test_generation_is_seeded():
    a = generate_level(np.random.default_rng(5))
    b = generate_level(np.random.default_rng(5))
    assert (a.boxes, a.targets, a.player) == (b.boxes, b.targets, b.player) and np.array_equal(a.floor, b.floor)


def test_move_effects_read_the_cells_next_to_the_player():
    # Up: a wall. Down: a box with a target behind it. Left: a box with a box behind it. Right: a box against the wall.
    crowded = SokobanLevel.from_text("######\n#OO#_#\n#XXPX#\n#__X_#\n#O_O_#\n######")
    assert move_effects(crowded) == ("wall", "push to target", "wall", "wall")
    # Floor and a target round the player (who stands on a target), a box with floor behind it.
    open_room = SokobanLevel.from_text("######\n#_O__#\n#_SX_#\n#____#\n#___X#\n######")
    assert move_effects(open_room) == ("walk", "walk", "walk", "push")


def test_reasoning_claims_are_checked_against_the_board_the_reply_was_written_for():
    env, _ = _env_with(LINE)  # player at row 1: Up wall, Down walk, Left wall, Right push (floor behind the box)
    text_env = env.unwrapped
    assert text_env.reasoning_claims("Up wall, Down walk, Left wall, Right push. Optimal plan has 2 moves.") == (4, 4)
    # Two wrong ("Down wall", "Left walk"), one right; the plan's length is not a claim it can check.
    assert text_env.reasoning_claims("Down wall, Left walk, right PUSH. Optimal plan has 3 moves.") == (3, 1)
    # "push" is not "push to target": the box lands on floor, one cell short of the target.
    assert text_env.reasoning_claims("Right push to target") == (1, 0)
    # A move claimed twice counts once, the first claim; no claim at all checks nothing.
    assert text_env.reasoning_claims("Up wall. Up walk.") == (1, 1)
    assert text_env.reasoning_claims("Optimal plan has 2 moves.") == (0, 0)
    # After one push the same words are checked against the new board: the box now sits next to the target.
    env.step("Right")
    assert text_env.reasoning_claims("Right push to target, Left walk") == (2, 2)


def test_max_solution_moves_redraws_long_levels_from_the_seeded_generator():
    """Each level is the first draw of the seed's generator solved in <= 2 moves: a seed whose first draw already
    is gives the unbounded env's level, the others a later draw (replayed here from gymnasium's seeding)."""
    plain = gym.make("rllib_ragen/Sokoban-v0").unwrapped
    easy = gym.make("rllib_ragen/Sokoban-v0", max_solution_moves=2).unwrapped
    kept = redrawn = 0
    for seed in range(123, 163):
        plain.reset(seed=seed)
        easy.reset(seed=seed)
        rng = gym.utils.seeding.np_random(seed)[0]
        draws = 0
        while True:
            draws += 1
            expected = generate_level(rng, 6, 1, 50)
            if len(solve_level(expected)) <= 2:
                break
        assert (easy.level.boxes, easy.level.player, easy.level.targets) == (
            expected.boxes,
            expected.player,
            expected.targets,
        )
        assert easy.optimal_solution_length() <= 2
        if draws == 1:
            kept += 1
            assert easy.level.boxes == plain.level.boxes and easy.level.player == plain.level.player
        else:
            redrawn += 1
            assert plain.optimal_solution_length() > 2
    assert kept and redrawn  # both cases were met


def test_max_solution_moves_refuses_bad_values_and_says_when_no_level_is_short_enough():
    for bad in (0, -1, 2.0, True, "3"):
        with pytest.raises(ValueError, match="max_solution_moves=.* must be a whole number >= 1"):
            gym.make("rllib_ragen/Sokoban-v0", max_solution_moves=bad)
    # Two boxes can never both be on their targets after one move.
    env = gym.make("rllib_ragen/Sokoban8x8TwoBoxes-v0", max_solution_moves=1)
    with pytest.raises(RuntimeError, match="max_solution_moves=1 moves: raise it"):
        env.reset(seed=0)
