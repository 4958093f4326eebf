"""Reading what a run recorded: Tune's results as flat rows, episodes' outcomes by validation state, baselines'
names, and the reasoning columns of rollout files. The report, the evaluator and the studies read through these;
none of them writes into the run folder.
"""

from __future__ import annotations

import json
import pathlib

from .outputs import read_run_json

def result_row(result: dict) -> dict[str, float]:
    """An RLlib result as one flat row of its numbers, each named by its path as Tune's loggers name it
    (``env_runners/episode_return_mean``); the config and anything not a number left out."""
    import numpy as np
    from ray.tune.utils import flatten_dict

    flat = flatten_dict({k: v for k, v in result.items() if k != "config"}, delimiter="/")
    return {k: float(v) for k, v in flat.items()
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))}


def read_results(trial: pathlib.Path) -> list[dict]:
    """Tune's results of a trial (its ``result.json``), one flat row per iteration (:func:`result_row`); an
    iteration a restored trial played again keeps its last result. Empty without the file."""
    by_iteration: dict[int, dict] = {}
    path = pathlib.Path(trial) / "result.json"
    for number, line in enumerate(path.read_text().splitlines() if path.is_file() else [], start=1):
        if not line.strip():
            continue
        try:
            row = result_row(json.loads(line))
            by_iteration[int(row["training_iteration"])] = row
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"{path}, line {number}, is not one of Tune's results ({type(error).__name__}: "
                             f"{error}); the file is damaged (a full disk or a kill while it was written?). "
                             "Remove or repair that line and report again.") from None
    return [by_iteration[i] for i in sorted(by_iteration)]


def baseline_name(file: pathlib.Path) -> str:
    """A baseline's name as the job gave it (recorded beside its episodes, ``names.json``), else the file's stem."""
    names = file.parent / "names.json"
    return read_run_json(names, {}).get(file.name, file.stem)


def outcomes_by_state(episodes) -> dict[str, float]:
    """Success per validation state, keyed ``"<env>:<seed>"`` (two environments' same seed stay apart): the mean
    over the state's episodes when validation plays several (``validation_group_size``). The state, not the
    episode, is what a paired comparison pairs: one state's episodes share its difficulty, and the k-th episode
    before has no more to do with the k-th after than with any other, so pairing episodes would count each state's
    luck several times and narrow the interval. String keys, so the outcomes are JSON. ``episodes`` yields
    ``(env name, seed, success)``."""
    totals: dict[str, tuple[float, int]] = {}
    for env, seed, success in episodes:
        key = f"{env}:{int(seed)}"
        total, count = totals.get(key, (0.0, 0))
        totals[key] = (total + float(success), count + 1)
    return {key: total / count for key, (total, count) in totals.items()}


def state_of(outcome_key: str) -> tuple[str, int]:
    """The ``(env name, seed)`` of an :func:`outcomes_by_state` key."""
    env, seed = outcome_key.rsplit(":", 1)
    return env, int(seed)


def trajectory_outcomes(trajectories) -> dict[str, float]:
    """:func:`outcomes_by_state` of played trajectories."""
    return outcomes_by_state((t.env_name, t.seed, t.success) for t in trajectories)


def read_outcomes(path: pathlib.Path) -> dict[str, float]:
    """:func:`outcomes_by_state` of a rollouts file written by :func:`write_rollouts`."""
    import pyarrow.parquet as pq

    records = pq.read_table(path, columns=["env", "seed", "success"]).to_pylist()
    return outcomes_by_state((r["env"], r["seed"], r["success"]) for r in records)


def read_first_reasonings(path: pathlib.Path, envs: set[str] | None = None) -> list[str] | None:
    """The first turn's reasoning (``<think>`` text) of each episode of a rollouts file written by
    :func:`write_rollouts`, of the environments named ``envs`` (None: all); None for a file without turns."""
    import pyarrow.parquet as pq

    if "turns" not in pq.read_schema(path).names:
        return None
    records = pq.read_table(path, columns=["env", "turns"]).to_pylist()
    return [r["turns"][0]["think"] if r["turns"] else "" for r in records if envs is None or r["env"] in envs]


def read_reasoning_claims(path: pathlib.Path, envs: set[str] | None = None) -> tuple[int, int]:
    """``(checked, true)`` summed over the episodes of a rollouts file (see ``TextEnv.reasoning_claims``), of the
    environments named ``envs`` (None: all); (0, 0) for a file written before the columns existed."""
    import pyarrow.parquet as pq

    if "reasoning_claims" not in pq.read_schema(path).names:
        return 0, 0
    records = pq.read_table(path, columns=["env", "reasoning_claims", "reasoning_claims_true"]).to_pylist()
    kept = [r for r in records if envs is None or r["env"] in envs]
    return sum(r["reasoning_claims"] for r in kept), sum(r["reasoning_claims_true"] for r in kept)

