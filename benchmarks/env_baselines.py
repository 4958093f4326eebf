"""The baselines of every environment: success of a random player and of the solver (where there is one) on the
validation states a job validates on (seeds 123...), played through the action protocol with RAGEN's budget
(10 turns, one move a reply, 10 moves an episode). The environments page quotes these figures.

    python benchmarks/env_baselines.py [--states 256]   # GEM and TextArena rows need rllib_ragen[gem,textarena]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import random
import re

from rllib_ragen.envs.countdown import _SYMBOLS
from rllib_ragen.envs.sudoku import MOVES as SUDOKU_MOVES
from rllib_ragen.rollout import RolloutConfig, RolloutEngine, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.context import last_turn_message
from rllib_ragen.rollout.tiny_model import build_tiny_tokenizer
from rllib_ragen.demonstrators import (
    countdown_solver_policy,
    fact_lookup_guess_policy,
    fact_lookup_solver_policy,
    frozen_lake_optimal_policy,
    guess_the_number_bisection_policy,
    guess_the_number_random_policy,
    random_moves_policy,
    sokoban_solver_policy,
    sudoku_solver_policy,
)

DIRECTIONS = ["Up", "Down", "Left", "Right"]


def countdown_random_policy(seed: int = 0):
    """Countdown: the numbers shown, shuffled, joined by random operations."""

    def policy(prompt: str) -> str:
        rng = random.Random(f"{seed}:{hashlib.sha256(prompt.encode()).hexdigest()}")
        numbers = re.search(r"Numbers: ([\d, ]+)\.", last_turn_message(prompt).observation).group(1).split(", ")
        rng.shuffle(numbers)
        expression = numbers[0]
        for n in numbers[1:]:
            expression = f"({expression} {rng.choice(list(_SYMBOLS.values()))} {n})"
        return f"<answer>{expression}</answer>"

    return policy


def table() -> list[tuple[str, dict, dict]]:
    """(environment id, its env_config, {baseline name: policy})."""
    lake = {
        "optimal policy": frozen_lake_optimal_policy(False, False),
        "random moves": random_moves_policy(["Left", "Down", "Right", "Up"], enable_thinking=False),
    }
    rows = [
        (
            "rllib_ragen/Sokoban-v0",
            {},
            {
                "solver": sokoban_solver_policy(1, False),
                "random moves": random_moves_policy(DIRECTIONS, enable_thinking=False),
            },
        ),
        (
            "rllib_ragen/Sokoban8x8TwoBoxes-v0",
            {},
            {
                "solver": sokoban_solver_policy(1, False),
                "random moves": random_moves_policy(DIRECTIONS, enable_thinking=False),
            },
        ),
        ("rllib_ragen/SokobanCoordinates-v0", {}, {"solver": sokoban_solver_policy(1, False)}),
        ("rllib_ragen/FrozenLakeNotSlippery-v0", {}, lake),
        (
            "rllib_ragen/FrozenLake-v0",
            {},
            {"optimal policy": frozen_lake_optimal_policy(False, True), "random moves": lake["random moves"]},
        ),
        (
            "rllib_ragen/Countdown-v0",
            {},
            {"solver": countdown_solver_policy(), "random expression": countdown_random_policy()},
        ),
        (
            "rllib_ragen/Sudoku4x4-v0",
            {},
            {
                "solver": sudoku_solver_policy(1),
                "random moves": random_moves_policy(SUDOKU_MOVES, enable_thinking=False),
            },
        ),
        (
            "rllib_ragen/FactLookup-v0",
            {},
            {"solver": fact_lookup_solver_policy(), "random city, no search": fact_lookup_guess_policy()},
        ),
    ]
    if importlib.util.find_spec("gem"):
        rows += [
            (
                f"gem/game.GuessTheNumber-v0-{level}",
                {},
                {"bisection": guess_the_number_bisection_policy(), "random guesses": guess_the_number_random_policy()},
            )
            for level in ("easy", "hard", "random")
        ]
        rows += [
            (
                "gem/game.Mastermind-v0-easy",
                {},
                {
                    "random guesses": random_moves_policy(
                        [f"{a} {b}" for a, b in itertools.permutations(range(1, 7), 2)], enable_thinking=False
                    )
                },
            ),
            ("gem/game.Sudoku-v0-easy", {}, {"random moves": random_moves_policy(SUDOKU_MOVES, enable_thinking=False)}),
            (
                "gem/game.TowerofHanoi-v0-easy",
                {},
                {
                    "random moves": random_moves_policy(
                        [f"{a} {b}" for a, b in itertools.permutations("ABC", 2)], enable_thinking=False
                    )
                },
            ),
            (
                "gem/game.Sokoban-v0-easy",
                {},
                {"random moves": random_moves_policy([d.lower() for d in DIRECTIONS], enable_thinking=False)},
            ),
        ]
    if importlib.util.find_spec("textarena"):
        rows += [
            (
                "textarena/FrozenLake-v0-train",
                {},
                {"random moves": random_moves_policy([d.lower() for d in DIRECTIONS], enable_thinking=False)},
            ),
            (
                "textarena/TowerOfHanoi-v0-train",
                {},
                {
                    "random moves": random_moves_policy(
                        [f"{a} {b}" for a, b in itertools.permutations("ABC", 2)], enable_thinking=False
                    )
                },
            ),
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=256, help="validation states per environment")
    args = parser.parse_args()
    tokenizer = build_tiny_tokenizer(seed=0)
    seeds = list(range(123, 123 + args.states))
    print(f"{'environment':40s} {'baseline':18s} success  (on {args.states} validation states, 10 moves)")
    for env_id, env_config, policies in table():
        for name, policy in policies.items():
            config = RolloutConfig(
                env=env_id,
                env_config=env_config,
                enable_thinking=False,
                max_turns=10,
                max_actions_per_turn=1,
                max_actions_per_episode=10,
                max_context_tokens=16384,
            )
            engine = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer)
            _, metrics = engine.rollout(seeds, 1, SamplingParams())
            print(f"{env_id:40s} {name:18s} {metrics['rollout/success']:.3f}")


if __name__ == "__main__":
    main()
