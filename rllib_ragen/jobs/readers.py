"""Reading what a run recorded: its trials and each one's config (from Tune's ``params.json``, never its pickle, and
refusing import paths unless allowed), Tune's results as flat rows, episodes' outcomes by validation state, baselines'
names, and the reasoning columns of rollout files. The report, the evaluator and the studies read through these;
none of them writes into the run folder.
"""

from __future__ import annotations

import json
import pathlib

from .outputs import read_run_json
from .paired_stats import paired_comparison


def result_row(result: dict) -> dict[str, float]:
    """An RLlib result as one flat row of its numbers, each named by its path as Tune's loggers name it
    (``env_runners/episode_return_mean``); the config and anything not a number left out."""
    import numpy as np
    from ray.tune.utils import flatten_dict

    flat = flatten_dict({k: v for k, v in result.items() if k != "config"}, delimiter="/")
    return {
        k: float(v)
        for k, v in flat.items()
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
    }


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
            raise ValueError(
                f"{path}, line {number}, is not one of Tune's results ({type(error).__name__}: "
                f"{error}); the file is damaged (a full disk or a kill while it was written?). "
                "Remove or repair that line and report again."
            ) from None
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


def outcome_pair(paths: tuple[pathlib.Path, pathlib.Path], envs: set[str] | None = None):
    """Each validation state's success in two rollout files, of the environments ``envs`` (None: all); None without
    both files, with different states, or with fewer than two."""
    if not all(path.is_file() for path in paths):
        return None
    before, after = (read_outcomes(path) for path in paths)
    if envs is not None:
        before, after = ({k: v for k, v in outcomes.items() if state_of(k)[0] in envs} for outcomes in (before, after))
    if before.keys() != after.keys() or len(before) < 2:
        return None  # e.g. a resumed run whose validation settings changed: not the same states
    return before, after


def paired_outcomes(paths: tuple[pathlib.Path, pathlib.Path], envs: set[str] | None = None) -> dict | None:
    """The paired comparison (``paired_stats``) of two rollout files; None as ``outcome_pair``."""
    pair = outcome_pair(paths, envs)
    return None if pair is None else paired_comparison(*pair).as_dict()


def files_in(folder: pathlib.Path, files: tuple[str, str]) -> tuple[pathlib.Path, pathlib.Path]:
    """``folder``'s two files of a (before, after) pair of names, e.g. a :data:`SAMPLED_AND_GREEDY` entry."""
    return folder / files[0], folder / files[1]


def trial_folders(run_dir: pathlib.Path) -> list[pathlib.Path]:
    """The trial folders of an experiment folder (each holds Tune's ``result.json``), or ``[run_dir]`` for a trial."""
    run_dir = pathlib.Path(run_dir)
    if (run_dir / "result.json").is_file():
        return [run_dir]
    return sorted(p.parent for p in run_dir.glob("*/result.json"))


class RunFolderImportError(ValueError):
    """A run folder's settings name an import path: playing them would import that module and run its code."""


def trial_config(trial: pathlib.Path, allow_imports: bool = False):
    """The trial's ``StarPOConfig``, from the parameters Tune stored (``params.json``).

    A run folder is data: an environment argument that is an import path (TRL-v0's ``environment`` and ``tasks``;
    ``TextEnv.import_path_arguments``) raises :class:`RunFolderImportError` naming the setting, unless
    ``allow_imports`` (the user's own run, or ``--allow-run-imports``)."""
    from ..starpo.config import StarPOConfig
    from ..starpo.environments import import_paths

    config = StarPOConfig.from_dict(trial_params(trial))
    found = [] if allow_imports else import_paths(config)
    if found:
        where, path = found[0]
        raise RunFolderImportError(
            f"{trial / 'params.json'}: {where}={path!r} is an import path; playing this run would import "
            f"{path.partition(':')[0]!r} and run its code. A run folder is data: pass --allow-run-imports only for a "
            "run you trust."
        )
    return config


def headline_environment(config):
    """The validation environment a run's table, paired statistics, baselines and validation splits score: the first
    one that builds the first training environment (the same environment with the same arguments, whatever its
    name), else the first validation environment (a run that validates only on environments it does not train on,
    as a transfer study does)."""
    first = config.training_environments()[0]
    entries = config.validation_environments()
    return next((e for e in entries if (e.env, e.env_config) == (first.env, first.env_config)), entries[0])


def scored_environments(config) -> set[str] | None:
    """The validation environments a trial's paired lines score: the headline one in a mixture, else all (None)."""
    return {headline_environment(config).name} if config.is_mixture else None


# Settings Tune writes to params.json only as their repr (classes, functions, gymnasium specs): the report keeps the
# library's defaults for them, and needs none of them. Besides, the keys RLlib's update_from_dict resolves as import
# paths (deserialize_type: a run folder's text there would import a module); StarPO reads none of them.
_NOT_DATA = frozenset(
    {
        "text_env_registrations",
        "callbacks_class",
        "exploration_config",
        "model",
        "replay_buffer_config",
        "sample_collector",
        "multiagent",
    }
)


def trial_params(trial: pathlib.Path) -> dict:
    """The trial's settings from Tune's ``params.json``: plain JSON, never its pickle (``params.pkl``), so that a
    report on a folder from elsewhere runs none of that folder's code. A setting whose default is no plain value (a
    class, a function) comes back as its repr: it keeps the library's default, except ``env``, whose text names the
    environment (a ``TextEnv`` class given as ``env`` is shown by its repr). Sentinel rules given as ``Rule`` objects
    are stored as their reprs too, which are not read back as code: the restored config has none (the firings are in
    the trial's ``sentinel.json``); rules given as dicts, as a main job gives them, come back."""
    from ..starpo.presets import PRESET_LABEL, VARIANT_LABEL
    from ..starpo.config import StarPOConfig

    path = trial / "params.json"
    try:
        params = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} is missing: the report reads a trial's settings from Tune's params.json "
            "(never from params.pkl, a pickle that would run code). Is this a trial folder of a "
            "finished or resumed job?"
        ) from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): the trial's settings cannot be read.") from None
    if not isinstance(params, dict):
        raise ValueError(f"{path} holds a {type(params).__name__}, not the trial's settings (a JSON object).")
    defaults = StarPOConfig().to_dict()
    kept = {}
    for key, value in params.items():
        default = defaults.get(key)
        # Only settings this version has (an unknown key would be set as an attribute nothing reads), and a grid's
        # labels (the sweep's trials are told apart by them).
        if key in (PRESET_LABEL, VARIANT_LABEL):
            kept[key] = value
            continue
        if key in _NOT_DATA or key not in defaults or not (key == "env" or _plain(default)):
            continue
        if key == "sentinel_rules" and not all(isinstance(rule, dict) for rule in value or []):
            continue
        kept[key] = tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value
    return kept


def _plain(value) -> bool:
    """Whether a value is JSON's kind of data (what params.json holds as itself, not as a repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False
