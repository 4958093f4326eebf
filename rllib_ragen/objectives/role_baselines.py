"""Role-conditioned advantage estimation (RAE, SPIRAL: arXiv 2506.24119): a running baseline per role.

In a two-seat game the seats' returns differ by the game itself (the first mover's edge), so one baseline for both
would teach each seat its seat. RAE keeps one exponential moving average of the return per role (here a training
environment and, in a multi-agent game, a seat), and a trajectory's advantage is its return minus its role's
baseline *before* the trajectory updates it (so the baseline never holds the return it is subtracted from). The
baseline starts at 0 and moves by ``(1 - decay) x (return - baseline)`` per trajectory, in the batch's order, as
SPIRAL's ``EMA`` does (decay 0.95 there).

The baselines live across iterations on the driver (``StarPO``'s checkpoint state holds them); the learner's
``rae`` estimator reads each row's baseline from the batch.
"""

from __future__ import annotations

from typing import Sequence


class RoleBaselines:
    """One running mean of the return per role; ``advance`` gives each trajectory its role's baseline and then
    moves that baseline toward the trajectory's return."""

    def __init__(self, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"rae_decay={decay} must be in [0, 1): 1 would never move the baseline from 0.")
        self.decay = float(decay)
        self.values: dict[str, float] = {}

    def advance(self, returns: Sequence[float], roles: Sequence[str]) -> list[float]:
        """Each return's baseline, read before the return moves it; the trajectories in the order given."""
        before = []
        for value, role in zip(returns, roles, strict=True):
            baseline = self.values.get(role, 0.0)
            before.append(baseline)
            self.values[role] = self.decay * baseline + (1.0 - self.decay) * float(value)
        return before

    def get_state(self) -> dict[str, float]:
        return dict(self.values)

    def set_state(self, state: dict[str, float]) -> None:
        self.values = {str(role): float(value) for role, value in state.items()}
