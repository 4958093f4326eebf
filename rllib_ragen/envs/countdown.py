"""Countdown played over several turns: combine the numbers into an expression equal to the target, and hear how
far off each attempt was."""

from __future__ import annotations

import ast
import itertools
import operator
import re
from fractions import Fraction

from .base import TextEnv

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# What an expression may contain: numbers, the four operations, parentheses and spaces (checked before parsing).
EXPRESSION = re.compile(r"[\d+\-*/() ]*\d[\d+\-*/() ]*")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """The exact value of an arithmetic expression of whole numbers, + - * / and parentheses, and the numbers it uses.

    Raises:
        ValueError: if it is anything else (a unary minus, a power, a name), or divides by zero.
    """

    def value(node) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("it divides by zero")
            return _OPERATORS[type(node.op)](left, right)
        raise ValueError("only whole numbers, + - * / and parentheses are allowed")

    used: list[int] = []
    try:
        return value(ast.parse(expression, mode="eval").body), used
    except (SyntaxError, RecursionError, MemoryError):  # not an expression, or nested past what Python parses
        raise ValueError("it is not an arithmetic expression Python can read") from None


def solve(numbers: list[int], target: int) -> str | None:
    """An expression using every number exactly once that equals ``target``, or None (exhaustive search over the
    order of combination; at most 4 numbers keep it to a few thousand expressions)."""

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target else None
        for i, j in itertools.permutations(range(len(items)), 2):
            (a, text_a), (b, text_b) = items[i], items[j]
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            for op in (ast.Add, ast.Sub, ast.Mult, ast.Div):
                if (op is ast.Div and b == 0) or (op in (ast.Add, ast.Mult) and i > j):  # commutative: once
                    continue
                found = search(rest + [(_OPERATORS[op](a, b), f"({text_a} {_SYMBOLS[op]} {text_b})")])
                if found:
                    return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    return found[1:-1] if found and found.startswith("(") else found


MAX_VALUE = 10**6  # the largest max_number / max_target
MAX_DRAWS = 10_000  # random expressions tried per reset before the settings are called impossible


class CountdownEnv(TextEnv):
    """Reach the target number with the given numbers and + - * /, using each number exactly once.

    ## Description
    The arithmetic game RAGEN trains on (from TinyZero), made multi-turn: each turn the agent proposes one
    expression and hears its value and how far it is from the target, so it can correct itself. Targets come from a
    random expression over the numbers drawn, so every puzzle has a solution (:func:`solve` finds one).

    ## Action Space
    ``Text``: an arithmetic expression, e.g. ``"(6 - 2) * 5"``: whole numbers, ``+ - * /`` and parentheses.

    ## Observation Space
    ``Text``: the numbers and the target, then the last attempt's value and distance, or what was wrong with it.

    ## Starting State
    ``num_numbers`` numbers from 1 to ``max_number`` and a target from 1 to ``max_target``, drawn from the reset seed;
    or the puzzle passed as ``options={"numbers": [...], "target": t}``.

    ## Rewards
    1 for the expression that equals the target, 0 otherwise.

    ## Episode End
    Terminates on the target. An expression that does not use each number exactly once, or divides by zero, is
    told so and changes nothing (``action_is_effective`` False); text that is no expression is an invalid action.

    ## Arguments
    ``num_numbers`` (3 or 4; default 3), ``max_number`` (20), ``max_target`` (100).

    ## Version History
    v0: initial release.
    """

    instructions = (
        "You are playing Countdown. Combine all the given numbers, each exactly once, with + - * / and "
        "parentheses into an expression equal to the target. Answer with the expression alone, e.g. "
        "(6 - 2) * 5. After each attempt you are told its value."
    )

    def __init__(
        self, num_numbers: int = 3, max_number: int = 20, max_target: int = 100, render_mode: str | None = "ansi"
    ):
        if isinstance(num_numbers, bool) or num_numbers not in (2, 3, 4):
            raise ValueError(f"num_numbers={num_numbers!r} must be 2, 3 or 4 (the solver searches them all).")
        for name, value in (("max_number", max_number), ("max_target", max_target)):
            # A target range of no whole number would make the puzzle draw loop forever; numpy draws below 2**63.
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VALUE:
                raise ValueError(f"{name}={value!r} must be a whole number from 1 to {MAX_VALUE:,}.")
        super().__init__(render_mode=render_mode, max_observation_chars=256)
        self.num_numbers, self.max_number, self.max_target = num_numbers, max_number, max_target
        self.numbers: list[int] = []
        self.target = 0
        self.feedback = ""

    def canonical_action(self, text: str) -> str | None:
        """The expression with single spaces, if it only holds numbers, + - * / and parentheses."""
        if not isinstance(text, str) or not EXPRESSION.fullmatch(text.strip()):
            return None
        return " ".join(text.split())

    def describe(self) -> str:
        return self.instructions

    def optimal_solution_length(self) -> int:
        return 1

    def solution(self) -> str:
        """An expression that reaches the target (:func:`solve`)."""
        return solve(self.numbers, self.target)

    def _reset_state(self) -> None:
        if "numbers" in self.reset_options:  # a fixed puzzle: reset(options={"numbers": [...], "target": t})
            options = self.reset_options
            self.numbers, self.target, self.feedback = [int(n) for n in options["numbers"]], int(options["target"]), ""
            return
        for _ in range(MAX_DRAWS):  # a random expression over the numbers; kept when its value is a target in range
            numbers = [int(n) for n in self.np_random.integers(1, self.max_number + 1, size=self.num_numbers)]
            value, text = Fraction(numbers[0]), str(numbers[0])
            for n in numbers[1:]:
                op = (ast.Add, ast.Sub, ast.Mult, ast.Div)[int(self.np_random.integers(4))]
                value, text = _OPERATORS[op](value, n), f"({text} {_SYMBOLS[op]} {n})"
            if value.denominator == 1 and 1 <= value <= self.max_target:
                break
        else:  # settings under which a target in range is (nearly) never drawn: say so rather than spin
            raise ValueError(
                f"no Countdown puzzle with a target from 1 to max_target={self.max_target} in "
                f"{MAX_DRAWS:,} draws of {self.num_numbers} numbers up to max_number={self.max_number}: "
                "raise max_target or lower max_number."
            )
        self.numbers, self.target, self.feedback = [int(n) for n in self.np_random.permutation(numbers)], int(value), ""

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        expression = self.canonical_action(action)
        if expression is None:
            return (
                self._render_text(),
                0.0,
                False,
                False,
                {"success": False, "action_is_valid": False, "action_is_effective": False},
            )
        effective = False
        try:
            value, used = evaluate(expression)
            if sorted(used) != sorted(self.numbers):
                raise ValueError(f"it uses {sorted(used)}, not each of {sorted(self.numbers)} exactly once")
            effective, self._success = True, value == self.target
            shown = str(value) if value.denominator == 1 else f"{float(value):.3g}"
            self.feedback = f"{expression} = {shown}, {abs(float(value - self.target)):g} away from {self.target}."
        except ValueError as error:
            self.feedback = f"{expression} does not count: {error}."
        info = {"success": self._success, "action_is_valid": True, "action_is_effective": effective}
        return self._render_text(), float(self._success), self._success, False, info

    def _render_text(self) -> str:
        state = f"Numbers: {', '.join(map(str, self.numbers))}. Target: {self.target}."
        return f"{state}\nLast attempt: {self.feedback}" if self.feedback else state
