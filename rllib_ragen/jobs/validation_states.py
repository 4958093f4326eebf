"""What each validation state is beyond its seed, for reporting success on it: the fewest actions that solve it
(where the environment can compute it, ``TextEnv.optimal_solution_length``) and whether training ever showed it.

The 6x6 one-box Sokoban level space is small: distinct seeds often draw the same level, so a validation seed can
be a level the policy trained on. A state counts as seen when its initial ``state_key`` matches that of any
training or warm-start seed.
"""

from __future__ import annotations

import pathlib
from typing import Iterable

from ..envs import make_text_env
from .outputs import read_run_json


def initial_states(
    env_id, env_config: dict, seeds: Iterable[int], solution_lengths: bool = False
) -> dict[int, tuple[str, int | None]]:
    """``{seed: (initial state key, optimal solution length)}``; the length is None unless ``solution_lengths``
    (solving costs far more than resetting) or where the environment cannot compute it."""
    env = make_text_env(env_id, **env_config)
    out = {}
    for seed in seeds:
        env.reset(seed=int(seed))
        text_env = env.unwrapped
        out[int(seed)] = (str(text_env.state_key()), text_env.optimal_solution_length() if solution_lengths else None)
    return out


DEMONSTRATIONS_FILE = "demonstrations.json"  # in a warm start's folder: the environment and seeds it was shown


def demonstrated_seeds(model: str) -> dict[str, range]:
    """``{env name: seeds}`` of the demonstrations a warm start saved in folder ``model`` was trained on (this
    run's or an earlier run's, passed as ``--model``); empty for a model without the record (a built-in one)."""
    record = pathlib.Path(str(model)) / DEMONSTRATIONS_FILE
    shown = read_run_json(record)
    if shown is None:
        return {}
    return {shown["env"]: range(*shown["seeds"])}


def trained_seeds_by_env(config, next_train: int) -> dict[str, list[int]]:
    """The seeds each training environment was reset with, training seeds ``train_seed_start`` to ``next_train``
    (the algorithm's seed schedule), ``num_groups`` per step, shared out as ``config.training_starts`` does."""
    seeds = list(range(config.train_seed_start, next_train))
    by_env: dict[str, list[int]] = {e.name: [] for e in config.training_environments()}
    for step in range(0, len(seeds), config.num_groups):
        for start in config.training_starts(seeds[step : step + config.num_groups]):
            name, seed = start if isinstance(start, tuple) else (config.env_name, start)
            by_env[name].append(seed)
    return by_env
