"""Scripted policies that speak the action protocol, for :class:`~rllib_ragen.rollout.backends.ScriptedBackend`.

They read the state from the prompt text, as a model would, and answer with an optimal plan: the Sokoban
solver's moves, FrozenLake's finite-horizon optimal move, Countdown's and 4x4 Sudoku's solutions, bisection in
GEM's Guess The Number, tic-tac-toe's minimax move, or Kuhn poker's equilibrium. They serve tests (the loop must
reach their known success rates), demonstrations for warm-start fine-tuning, and baselines a job pairs its agent
against (``frozen_lake_hole_blind_policy``, ``random_moves_policy``).
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Sequence

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

from .envs.frozen_lake import ACTION_NAMES as LAKE_ACTIONS
from .envs.frozen_lake import SYMBOLS as LAKE_SYMBOLS
from .envs.frozen_lake import move_effects as lake_move_effects
from .envs.frozen_lake import optimal_policy
from .envs.sokoban_levels import ACTION_NAMES, SokobanLevel, move_effects, solve_level
from .envs.kuhn_poker import DECISIONS as KUHN_DECISIONS
from .envs.kuhn_poker import SEATS as KUHN_SEATS
from .envs.kuhn_poker import decision_views, equilibrium_strategy
from .envs.kuhn_poker import info_sets as kuhn_info_sets
from .envs.tic_tac_toe import best_cells
from .rollout.context import last_turn_message


def _reply(actions: list[str], thinking: str, enable_thinking: bool) -> str:
    answer = f"<answer>{' || '.join(actions)}</answer>"
    return f"<think>{thinking}</think>{answer}" if enable_thinking else answer


SOKOBAN_REASONING = ("plan", "effects")


def sokoban_solver_policy(max_actions_per_turn: int = 5, enable_thinking: bool = True, reasoning: str = "plan"):
    """A policy that replies with the next moves of an optimal solution of the state it is shown.

    Args:
        reasoning: the ``<think>`` line. ``"plan"``: "Optimal plan has 3 moves."; ``"effects"``: what each move
            would do from the board shown (``move_effects``), then the same sentence: "Up walk, Down wall, Left
            wall, Right push to target. Optimal plan has 1 moves." Every word of the effects is read off the cells
            next to the player, so a model cannot predict them without finding the player on the board.
    """
    if reasoning not in SOKOBAN_REASONING:
        raise ValueError(f"reasoning={reasoning!r}: choose one of {list(SOKOBAN_REASONING)}.")

    def policy(prompt: str) -> str:
        level = SokobanLevel.from_text(last_turn_message(prompt).observation)
        solution = solve_level(level) or ["Up"]
        thinking = f"Optimal plan has {len(solution)} moves."
        if reasoning == "effects":
            effects = ", ".join(f"{move} {effect}" for move, effect in zip(ACTION_NAMES, move_effects(level)))
            thinking = f"{effects}. {thinking}"
        return _reply(solution[:max_actions_per_turn], thinking, enable_thinking)

    return policy


FROZEN_LAKE_REASONING = ("plain", "effects")


def frozen_lake_optimal_policy(enable_thinking: bool = True, is_slippery: bool = True, reasoning: str = "plain"):
    """A policy that replies with the one move maximising P(goal within the remaining budget).

    Args:
        enable_thinking: whether replies carry a ``<think>`` line.
        is_slippery: must match the environment's ice (on solid ice the best move is a shortest-path move).
        reasoning: the ``<think>`` line. ``"plain"``: a fixed sentence ("Shortest safe path."); ``"effects"``:
            where each move would lead from the player's cell (``move_effects``): "Left edge, Down hole, Right
            ice, Up goal." Those words are read off the cells next to the player, so a model cannot predict
            them without finding itself on the map, and the move follows them.
    """
    if reasoning not in FROZEN_LAKE_REASONING:
        raise ValueError(f"reasoning={reasoning!r}: choose one of {list(FROZEN_LAKE_REASONING)}.")
    return _lake_policy(enable_thinking, is_slippery, reasoning, sees_holes=True)


def frozen_lake_hole_blind_policy(enable_thinking: bool = True, is_slippery: bool = True):
    """The optimal policy of the same map with every hole turned to ice: it heads for the goal as if there were no
    holes, and steps into one whenever one lies on its way. A baseline for a learned policy: one that has found
    the goal on the map but not the holes next to it plays like this (the FrozenLake job pairs
    its agent against it on the validation maps). Same arguments as :func:`frozen_lake_optimal_policy`."""
    return _lake_policy(enable_thinking, is_slippery, "plain", sees_holes=False)


_LAKE_LETTERS = {
    LAKE_SYMBOLS["frozen"]: "F",
    LAKE_SYMBOLS["hole"]: "H",
    LAKE_SYMBOLS["goal"]: "G",
    LAKE_SYMBOLS["player"]: "S",
}


def _lake_policy(enable_thinking: bool, is_slippery: bool, reasoning: str, sees_holes: bool):
    """The finite-horizon optimal move of the map in the last message (``sees_holes=False``: of that map with its
    holes turned to ice), with its reply."""

    def policy(prompt: str) -> str:
        message = last_turn_message(prompt)
        state, left = message.observation, message.actions_left
        rows = ["".join(_LAKE_LETTERS.get(ch, "F") for ch in row) for row in state.splitlines()]
        planned = rows if sees_holes else [row.replace("H", "F") for row in rows]
        position = state.replace("\n", "").index(LAKE_SYMBOLS["player"])
        lake = FrozenLakeEnv(desc=planned, is_slippery=is_slippery)
        _, actions = optimal_policy(lake.P, len(rows) ** 2, max(left, 1))
        move = LAKE_ACTIONS[int(actions[max(left, 1), position])]
        if reasoning == "effects":
            effects = lake_move_effects(rows, position)
            thinking = ", ".join(f"{name} {effect}" for name, effect in zip(LAKE_ACTIONS, effects)) + "."
        else:
            thinking = "Best move on slippery ice." if is_slippery else "Shortest safe path."
        return _reply([move], thinking, enable_thinking)

    return policy


def random_moves_policy(moves: Sequence[str], per_reply: int = 1, enable_thinking: bool = True, seed: int = 0):
    """A policy that replies with ``per_reply`` moves drawn uniformly from ``moves`` (e.g. Sokoban's
    ``ACTION_NAMES``): the floor a learned policy has to clear. The draw is seeded by ``seed`` and the conversation so
    far, so a state played twice gets the same moves, whatever order the episodes are played in."""
    moves = list(moves)
    if per_reply < 1 or not moves:
        raise ValueError(f"random_moves_policy needs moves to draw from and per_reply >= 1 (got {moves}, {per_reply}).")

    def policy(prompt: str) -> str:
        rng = random.Random(f"{seed}:{hashlib.sha256(prompt.encode()).hexdigest()}")
        return _reply([rng.choice(moves) for _ in range(per_reply)], "I move at random.", enable_thinking)

    return policy


def random_arm_policy(seed: int = 0, enable_thinking: bool = True):
    """A bandit policy that pulls one of the arms it is shown uniformly at random: demonstrations of the format
    with no preference between arms, so that whatever preference a model ends up with, RL taught it."""
    import random

    rng = random.Random(seed)
    arms = re.compile(r"Arms: (.+)")

    def policy(prompt: str) -> str:
        state = last_turn_message(prompt).observation
        names = [name.strip() for name in arms.search(state).group(1).split(",")]
        return _reply([rng.choice(names)], "I pick one of the arms.", enable_thinking)

    return policy


# GEM's Guess The Number writes its range in the instructions and a hint after each guess.
_GUESS_RANGE = re.compile(r"guess the number between (\d+) and (\d+)")
_GUESS_HINT = re.compile(r"you guessed (\d+), and the target number is (higher|lower) than")


def _guess_interval(prompt: str) -> tuple[int, int, set[int]]:
    """The numbers still possible after the hints in ``prompt``, as (low, high), and the guesses made so far."""
    low, high = (int(n) for n in _GUESS_RANGE.search(prompt).groups())
    guessed = set()
    for number, direction in _GUESS_HINT.findall(prompt):
        number = int(number)
        guessed.add(number)
        low, high = (max(low, number + 1), high) if direction == "higher" else (low, min(high, number - 1))
    return low, max(low, high), guessed


def guess_the_number_bisection_policy(enable_thinking: bool = False):
    """GEM's Guess The Number (``gem/game.GuessTheNumber-v0-*``) played by bisection: the middle of the numbers the
    hints still allow. It finds any number of a range of n in at most ceil(log2(n + 1)) guesses."""

    def policy(prompt: str) -> str:
        low, high, _ = _guess_interval(prompt)
        return _reply([str((low + high) // 2)], f"It lies in {low} to {high}.", enable_thinking)

    return policy


def guess_the_number_random_policy(enable_thinking: bool = False, seed: int = 0):
    """GEM's Guess The Number played by guessing a number of the range it has not guessed yet, ignoring the hints:
    the baseline that shows whether an agent reads them. Seeded by ``seed`` and the conversation so far."""

    def policy(prompt: str) -> str:
        rng = random.Random(f"{seed}:{hashlib.sha256(prompt.encode()).hexdigest()}")
        low, high = (int(n) for n in _GUESS_RANGE.search(prompt).groups())
        left = sorted(set(range(low, high + 1)) - _guess_interval(prompt)[2]) or [low]
        return _reply([str(rng.choice(left))], "I guess at random.", enable_thinking)

    return policy


def countdown_solver_policy(enable_thinking: bool = False):
    """Countdown (``rllib_ragen/Countdown-v0``) solved in one reply: an expression from the exhaustive solver for the
    numbers and target it is shown."""
    from .envs.countdown import solve

    shown = re.compile(r"Numbers: ([\d, ]+)\. Target: (\d+)\.")

    def policy(prompt: str) -> str:
        numbers, target = shown.search(last_turn_message(prompt).observation).groups()
        expression = solve([int(n) for n in numbers.split(",")], int(target)) or numbers.replace(",", " +")
        return _reply([expression], f"Reach {target}.", enable_thinking)

    return policy


def sudoku_solver_policy(max_actions_per_turn: int = 5, enable_thinking: bool = False):
    """4x4 Sudoku (``rllib_ragen/Sudoku4x4-v0``): the solution's moves for the grid it is shown, in reading order."""
    import numpy as np

    from .envs.sudoku import solutions

    def policy(prompt: str) -> str:
        rows = last_turn_message(prompt).observation.strip().splitlines()
        grid = np.array([[0 if cell == "." else int(cell) for cell in row.split()] for row in rows])
        solved = (solutions(grid, limit=1) or [grid])[0]
        moves = [f"{r + 1} {c + 1} {solved[r, c]}" for r, c in np.argwhere(grid == 0)]
        return _reply(moves[:max_actions_per_turn] or ["1 1 1"], f"{len(moves)} cells to fill.", enable_thinking)

    return policy


# FactLookup (rllib_ragen/FactLookup-v0): the question, and what a search returned.
_LOOKUP_QUESTION = re.compile(r"Question: In which city does (\w+) live\?")
_LOOKUP_FOUND = re.compile(r"(\w+) lives in (\w+)\.")


def _tool_call(name: str, arguments: dict) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def fact_lookup_solver_policy():
    """FactLookup played with its tools, as Hermes-style calls: search the person the question names, then answer
    with the city the search returned."""

    def policy(prompt: str) -> str:
        person = _LOOKUP_QUESTION.findall(prompt)[-1]
        found = dict(_LOOKUP_FOUND.findall(prompt.split("Question:")[-1]))
        if person in found:
            return _tool_call("answer", {"city": found[person]})
        return _tool_call("search", {"name": person})

    return policy


def fact_lookup_guess_policy(seed: int = 0):
    """FactLookup without its search tool: answer a city drawn at random (success 1 / len(CITIES)), the baseline
    that shows what the tools are worth. Seeded by ``seed`` and the conversation so far."""
    from .envs.lookup import CITIES

    def policy(prompt: str) -> str:
        rng = random.Random(f"{seed}:{hashlib.sha256(prompt.encode()).hexdigest()}")
        return _tool_call("answer", {"city": rng.choice(CITIES)})

    return policy


_BOARD_ROW = re.compile(r"^ (\S) \| (\S) \| (\S)$", re.MULTILINE)


def _tic_tac_toe_position(prompt: str) -> tuple[tuple[str, ...], str]:
    """The last board the prompt shows (cells "X", "O" or "") and the seat's mark ("You play X")."""
    rows = _BOARD_ROW.findall(prompt)[-3:]
    mark = re.findall(r"You play ([XO])", prompt)[-1]
    return tuple(cell if cell in "XO" else "" for row in rows for cell in row), mark


def tic_tac_toe_minimax_policy(enable_thinking: bool = False, seed: int = 0):
    """Perfect tic-tac-toe from the prompt: the last board shown and the seat's mark ("You play X"), answered with a
    move of best minimax value, drawn among them by ``seed`` and the conversation (as :func:`random_moves_policy`
    draws). Against it the best result is a draw."""

    def policy(prompt: str) -> str:
        board, mark = _tic_tac_toe_position(prompt)
        rng = random.Random(f"{seed}:{hashlib.sha256(prompt.encode()).hexdigest()}")
        return _reply([str(rng.choice(best_cells(board, mark)) + 1)], "The best cell.", enable_thinking)

    return policy


def tic_tac_toe_random_policy(enable_thinking: bool = False, seed: int = 0):
    """A legal tic-tac-toe move drawn uniformly among the empty cells of the last board shown (seeded as
    :func:`random_moves_policy`): demonstrations of the format and the rules with no strategy, so whatever a model
    learns beyond them, RL taught it (the self-play job's warm start)."""

    def policy(prompt: str) -> str:
        board, _ = _tic_tac_toe_position(prompt)
        rng = random.Random(f"{seed}:{hashlib.sha256(prompt.encode()).hexdigest()}")
        return _reply([str(rng.choice([i for i, c in enumerate(board) if not c]) + 1)], "A free cell.", enable_thinking)

    return policy


def _kuhn_decision(prompt: str, views: dict) -> tuple[str, tuple[str, tuple[str, ...]]]:
    """The seat and decision point of the last Kuhn poker view the prompt shows (of ``views``: ``decision_views()``)."""
    last = max(views, key=prompt.rfind)
    if prompt.rfind(last) < 0:
        raise ValueError("the prompt shows no Kuhn poker decision ('Your card: ...' up to 'Your move: ...').")
    return views[last]


def kuhn_poker_strategy_policy(strategy=None, enable_thinking: bool = False, seed: int = 0):
    """Kuhn poker by a strategy (the aggressive move's probability at each decision point; default: Kuhn's
    equilibrium), read from the last view the prompt shows. Unlike the other scripted players it draws from one
    generator seeded by ``seed``, call after call, so one decision shown many times gets the strategy's mixture (a
    draw seeded by the prompt would give a pure strategy: a hand has 12 views); the same calls in the same order give
    the same moves. ``strategy=dict.fromkeys(..., 0.5)`` (:func:`kuhn_poker_random_policy`) demonstrates the rules."""
    strategy = equilibrium_strategy() if strategy is None else strategy
    rng, views = random.Random(seed), decision_views()  # the views once: a warm start asks for thousands of moves

    def policy(prompt: str) -> str:
        _, point = _kuhn_decision(prompt, views)
        passive, aggressive = KUHN_DECISIONS[point[1]][1]
        move = aggressive if rng.random() < float(strategy[point]) else passive
        return _reply([move], "A legal move.", enable_thinking)

    return policy


def kuhn_poker_random_policy(enable_thinking: bool = False, seed: int = 0):
    """Each legal Kuhn poker move with probability 1/2: the rules and the format, no strategy (the self-play job's
    warm start on Kuhn poker)."""
    uniform = {point: 0.5 for seat in KUHN_SEATS for point in kuhn_info_sets(seat)}
    return kuhn_poker_strategy_policy(uniform, enable_thinking, seed)
