import gymnasium as gym
import numpy as np
import pytest

import rllib_ragen  # noqa: F401
from rllib_ragen.envs.frozen_lake import generate_map, move_effects, optimal_policy

OPEN_MAP = ["FFFF", "FSFF", "FFFF", "FFFG"]  # start at (1, 1), nothing nearby but ice


def _next_cells(env_id, action, trials):
    env = gym.make(env_id)
    counts = {}
    for seed in range(trials):
        env.reset(seed=seed, options={"map": OPEN_MAP})
        env.step(action)
        cell = env.unwrapped.position
        counts[cell] = counts.get(cell, 0) + 1
    return counts


def test_slippery_transitions_match_the_model():
    # "Right" from (1,1): intended (1,2)=6, perpendicular (2,1)=9 and (0,1)=1, each with probability 1/3.
    trials = 3000
    counts = _next_cells("rllib_ragen/FrozenLake-v0", "Right", trials)
    assert set(counts) == {6, 9, 1}
    chi2 = sum((counts[c] - trials / 3) ** 2 / (trials / 3) for c in counts)
    assert chi2 < 13.8, f"chi-square {chi2:.1f} (df=2) rejects the 1/3-1/3-1/3 model at p=0.001: {counts}"


def test_not_slippery_moves_as_told():
    assert _next_cells("rllib_ragen/FrozenLakeNotSlippery-v0", "Right", 50) == {6: 50}


def test_symbols_for_hole_and_goal():
    env = gym.make("rllib_ragen/FrozenLakeNotSlippery-v0", size=2)
    obs, _ = env.reset(seed=0, options={"map": ["SH", "GF"]})
    assert obs == "PO\nG_"
    obs, r, term, _, info = env.step("Right")
    assert (obs, r, term, info["success"]) == ("_X\nG_", 0.0, True, False)
    env.reset(seed=0, options={"map": ["SH", "GF"]})
    obs, r, term, _, info = env.step("Down")
    assert (obs, r, term, info["success"]) == ("_O\n√_", 1.0, True, True)


def test_move_effects_name_the_cell_each_move_leads_to():
    # Player (S) at row 1, column 0: Left is off the map, Down a hole, Right ice, Up the goal.
    lake = ["GFFF", "SFFF", "HFFF", "FFFF"]
    assert move_effects(lake, 4) == ("edge", "hole", "ice", "goal")
    # From the bottom-right corner: Down and Right are edges; the start tile counts as ice like any frozen one.
    assert move_effects(["FFFF", "FFFF", "FFFS", "FFHF"], 15) == ("hole", "edge", "edge", "ice")


def test_reasoning_claims_are_checked_against_the_players_cell_now():
    env = gym.make("rllib_ragen/FrozenLakeNotSlippery-v0")
    env.reset(seed=0, options={"map": ["GFFF", "SFFF", "HFFF", "FFFF"]})
    lake = env.unwrapped
    assert lake.reasoning_claims("Left edge, Down hole, Right ice, Up goal.") == (4, 4)
    # Case-insensitive; "Down ice" is wrong (a hole), and a move claimed twice counts once, the first claim.
    assert lake.reasoning_claims("down ICE, Up goal. Up ice.") == (2, 1)
    assert lake.reasoning_claims("Shortest safe path.") == (0, 0)
    env.step("Right")  # now at row 1, column 1: the same words are checked from the new cell
    assert lake.reasoning_claims("Left ice, Down ice, Right ice, Up ice.") == (4, 4)


def test_generated_maps_have_distinct_random_start_goal_and_a_path():
    starts, goals = set(), set()
    for seed in range(300):
        desc = generate_map(np.random.default_rng(seed))
        flat = "".join(desc)
        assert flat.count("S") == 1 and flat.count("G") == 1
        starts.add(flat.index("S"))
        goals.add(flat.index("G"))
        env = gym.make("rllib_ragen/FrozenLakeNotSlippery-v0")
        env.reset(seed=0, options={"map": desc})
        assert env.unwrapped.success_probability(moves_left=16) == 1.0  # deterministic: a path exists
    assert len(starts) > 10 and len(goals) > 10


def test_value_iteration_by_hand():
    # Not slippery, goal three moves away (Right, Right, Down): probability 0 with 2 moves left, 1 with 3.
    env = gym.make("rllib_ragen/FrozenLakeNotSlippery-v0", size=3)
    env.reset(seed=0, options={"map": ["SFF", "HHG", "FFF"]})
    lake = env.unwrapped.lake
    values, actions = optimal_policy(lake.P, 9, horizon=3)
    assert values[1, 0] == 0.0 and values[2, 0] == 0.0 and values[3, 0] == 1.0
    assert actions[3, 0] == 2  # Right


def test_optimal_policy_takes_the_shortest_path_among_equally_safe_ones():
    # Solid ice, goal two moves away: with 6 moves left a detour (Up into the wall, Left) still arrives in time,
    # so it ties on success probability; the policy must still head straight for the goal.
    env = gym.make("rllib_ragen/FrozenLakeNotSlippery-v0", size=3)
    env.reset(seed=0, options={"map": ["FFF", "FSF", "FFG"]})
    moves = 0
    while env.unwrapped.lake.desc.flat[env.unwrapped.position] != b"G":
        env.step(env.unwrapped.optimal_action(moves_left=6 - moves))
        moves += 1
    assert moves == 2


def test_solid_ice_is_not_described_as_slippery():
    assert "slippery" in gym.make("rllib_ragen/FrozenLake-v0").unwrapped.describe()
    assert "slippery" not in gym.make("rllib_ragen/FrozenLakeNotSlippery-v0").unwrapped.describe()


def test_optimal_policy_success_matches_its_prediction():
    # Play the finite-horizon optimal policy with a 10-action budget; the empirical success rate must match the
    # mean of the predicted success probabilities within 4 standard errors.
    env = gym.make("rllib_ragen/FrozenLake-v0")
    budget, predicted, achieved = 10, [], []
    for seed in range(1500):
        env.reset(seed=seed)
        predicted.append(env.unwrapped.success_probability(budget))
        for moves_left in range(budget, 0, -1):
            _, _, terminated, _, info = env.step(env.unwrapped.optimal_action(moves_left))
            if terminated:
                break
        achieved.append(env.unwrapped.success)
    p = np.array(predicted)
    stderr = np.sqrt((p * (1 - p)).sum()) / len(p)
    assert abs(np.mean(achieved) - p.mean()) < 4 * stderr
    print(f"\nFrozenLake optimal policy, 10 actions: success {np.mean(achieved):.3f}, predicted {p.mean():.3f}")


def test_bad_map_option_is_rejected():
    with pytest.raises(ValueError, match="rows"):
        gym.make("rllib_ragen/FrozenLake-v0").reset(seed=0, options={"map": ["SF", "FG"]})


def test_a_transition_seed_keeps_the_map_and_draws_the_slips_from_its_own_generator():
    from rllib_ragen.envs import TRANSITION_SEED

    env = gym.make("rllib_ragen/FrozenLake-v0")
    apart = 0
    for seed in range(100):
        assert env.reset(seed=seed, options={TRANSITION_SEED: (seed, 3)})[0] == env.reset(seed=seed)[0]  # map, start
        env.reset(seed=seed, options={"map": OPEN_MAP})
        env.step("Right")
        shared_cell = env.unwrapped.position
        env.reset(seed=seed, options={"map": OPEN_MAP, TRANSITION_SEED: (seed, 3)})
        env.step("Right")
        # "Right" from (1, 1) goes Down (9), Right (6) or Up (1), picked by the first draw of the generator seeded
        # by (seed, 3) against the cumulative probabilities 1/3, 2/3, 1.
        u = np.random.default_rng(np.random.SeedSequence((seed, 3))).random()
        assert env.unwrapped.position == [9, 6, 1][int(np.argmax(np.cumsum([1 / 3] * 3) > u))]
        apart += env.unwrapped.position != shared_cell
    assert 45 < apart < 90  # independent slips land apart with probability 2/3
