"""Two-armed bandit with symbolic arm names: a single-turn test of whether an agent weighs risk."""

from __future__ import annotations

from .base import TextEnv


class BanditEnv(TextEnv):
    """Two-armed bandit whose arms carry symbolic names.

    ## Description
    The agent sees two arms in a per-seed shuffled order and pulls one. The *low-risk* arm always pays
    ``low_risk_reward``; the *high-risk* arm pays ``high_risk_reward`` with probability ``high_risk_prob`` and 0
    otherwise. With the defaults the high-risk arm has the higher expected value (0.25 > 0.15), so a
    risk-neutral agent should learn to prefer it.

    ## Action Space
    ``Text``: the name of an arm, case-insensitive (default ``"Phoenix"`` or ``"Dragon"``).

    ## Observation Space
    ``Text``: the list of arms in the order shown, e.g. ``"Arms: Dragon, Phoenix"``.

    ## Starting State
    The arm order is shuffled by the reset seed.

    ## Rewards
    The payoff of the pulled arm. An unknown name pays 0 and leaves the episode running.

    ## Episode End
    Terminates after one valid pull. ``success`` is True when the pulled arm has the higher expected value.
    The game is single-turn (``max_turns = 1``): an agent's reply with no valid pull ends the episode too.

    ## Arguments
    ``low_risk_name``, ``high_risk_name``: the arms' names. ``low_risk_reward``: the fixed payoff (the paper
    uses 0.15). ``high_risk_reward``, ``high_risk_prob``: the risky payoff and its probability.

    ## Version History
    v0: initial release. Variants: ``BanditHeldOut-v0`` (arms renamed Librarian/Trader) and
    ``BanditReversed-v0`` (Dragon is the safe arm, Phoenix the risky one).
    """

    instructions = (
        "You are playing a bandit game. Goal: maximize your reward by choosing the best arm. "
        "Each arm has a name; the name may hint at how the arm pays. Answer with the name of one arm."
    )
    max_turns = 1  # one reply per episode, as in RAGEN

    def __init__(
        self,
        low_risk_name: str = "Phoenix",
        high_risk_name: str = "Dragon",
        low_risk_reward: float = 0.15,
        high_risk_reward: float = 1.0,
        high_risk_prob: float = 0.25,
        render_mode: str | None = "ansi",
    ):
        if low_risk_name.strip().lower() == high_risk_name.strip().lower():
            raise ValueError(f"Bandit arm names must differ, got {low_risk_name!r} twice.")
        if not 0.0 <= high_risk_prob <= 1.0:
            raise ValueError(f"high_risk_prob={high_risk_prob} must lie in [0, 1].")
        # Instance attribute shadows the class one; set before TextEnv builds the lookup table.
        self.action_names = (low_risk_name, high_risk_name)
        super().__init__(render_mode=render_mode)
        self.payoffs = {0: (low_risk_reward, 1.0), 1: (high_risk_reward, high_risk_prob)}
        expected = [reward * prob for reward, prob in self.payoffs.values()]
        self.best_arm = int(expected[1] > expected[0])
        self._order = [0, 1]

    def _reset_state(self) -> None:
        self._order = [int(i) for i in self.np_random.permutation(2)]

    def _apply(self, action_index: int) -> tuple[float, bool, bool]:
        reward, prob = self.payoffs[action_index]
        paid = reward if self.np_random.random() < prob else 0.0
        self._success = action_index == self.best_arm
        return paid, True, True

    def _render_text(self) -> str:
        return "Arms: " + ", ".join(self.action_names[i] for i in self._order)
