"""What each held-out state is beyond its seed, for reporting success on it: the fewest actions that solve it
(where the environment can compute it, ``TextEnv.optimal_solution_length``) and whether training ever showed it.

The 6x6 one-box Sokoban level space is small: distinct seeds often draw the same level, so a "held-out" seed can
be a level the policy trained on. A state counts as seen when its initial ``state_key`` matches that of any
training or warm-start seed.
"""

from __future__ import annotations

from typing import Iterable

from .envs import make_text_env


def initial_states(env_id, env_config: dict, seeds: Iterable[int],
                   solution_lengths: bool = False) -> dict[int, tuple[str, int | None]]:
    """``{seed: (initial state key, optimal solution length)}``; the length is None unless ``solution_lengths``
    (solving costs far more than resetting) or where the environment cannot compute it."""
    env = make_text_env(env_id, **env_config)
    out = {}
    for seed in seeds:
        env.reset(seed=int(seed))
        text_env = env.unwrapped
        out[int(seed)] = (str(text_env.state_key()),
                          text_env.optimal_solution_length() if solution_lengths else None)
    return out
