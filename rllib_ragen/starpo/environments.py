"""What a StarPO config trains and validates on: one environment, or a mixture of them (``train_envs``,
``validation_envs``), each entry checked by name before anything is built (``StarPOConfig.environment``); and
what a config reads from them (:class:`ConfigEnvironments`): its environments, their names, and the starts of its
training steps, curriculum stages and validation."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Sequence

import gymnasium as gym

from ..envs import BUILT_IN_TEXT_ENVS, REMOTE_ENV_ID, TRL_ENV_ID, ensure_registered, make_text_env, registered_text_envs
from ..envs.base import load_import_path
from ..rollout.trajectory import Start
from .knobs import MAX_VALIDATION_STATES, is_int

# Keys of one entry of ``train_envs`` / ``validation_envs`` (``StarPOConfig.environment``); the count key is required
# in training entries and defaults to ``validation_size`` in validation ones.
ENV_ENTRY_KEYS = {
    "train_envs": ("env", "env_config", "name", "groups"),
    "validation_envs": ("env", "env_config", "name", "states"),
}


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """One environment of a mixture: its name (in metrics and outputs), what builds it, and how many groups per
    training step (training) or validation states (validation) it gets."""

    name: str
    env: Any
    env_config: dict
    count: int


def env_name(env) -> str:
    """The name an environment's trajectories and metrics carry by default: its registered id, or class name."""
    return env if isinstance(env, str) else getattr(env, "__name__", repr(env))


def env_class(env) -> type:
    """The class a registered id (or a TextEnv class) builds. A registration's entry point is the class itself, a
    function that builds it (its return annotation names the class: ``register_text_env`` checks it), or the import
    path of either; only a path is imported."""
    if isinstance(env, type):
        return env
    entry_point = gym.spec(env).entry_point
    built = load_import_path(entry_point, "entry_point") if isinstance(entry_point, str) else entry_point
    return built if isinstance(built, type) else typing.get_type_hints(built).get("return", built)


def env_arguments(env) -> set[str] | None:
    """The constructor arguments ``env`` (a registered id or a TextEnv class) accepts; None if it takes any."""
    parameters = inspect.signature(env_class(env).__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.name != "self"}


def import_paths(config) -> list[tuple[str, str]]:
    """``(setting, path)`` for each import path that building ``config``'s environments would import: an argument the
    environment's class lists in ``TextEnv.import_path_arguments``, given as text (TRL-v0's ``environment`` and
    ``tasks``). Importing a module runs its code, so the readers of a run folder refuse them unless allowed."""
    entries = [("env_config", config.env, config.env_config)]
    for field in ("train_envs", "validation_envs"):
        entries += [
            (f"{field}[{i}]['env_config']", item.get("env"), item.get("env_config") or {})
            for i, item in enumerate(getattr(config, field) or [])
            if isinstance(item, dict)
        ]
    entries += [
        (f"curriculum[{i}]['env_config']", config.env, stage.get("env_config") or {})
        for i, stage in enumerate(config.curriculum or [])
        if isinstance(stage, dict)
    ]
    found = []
    for where, env, env_config in entries:
        if not isinstance(env_config, dict) or not is_known_env(env):
            continue
        for name in getattr(env_class(env), "import_path_arguments", ()):
            if isinstance(env_config.get(name), str):
                found.append((f"{where}[{name!r}]", env_config[name]))
    return found


def is_known_env(env) -> bool:
    ensure_registered(env)  # another package's game ("gem/...", "textarena/...") is registered when first named
    return isinstance(env, type) or env in registered_text_envs()


def entry(item: dict, count_key: str, default_count: int | None) -> EnvEntry:
    """The :class:`EnvEntry` of one (checked) ``train_envs`` / ``validation_envs`` item."""
    return EnvEntry(
        name=item.get("name") or env_name(item["env"]),
        env=item["env"],
        env_config=dict(item.get("env_config") or {}),
        count=int(item.get(count_key, default_count)),
    )


def env_config_errors(field: str, env, env_config):
    if not isinstance(env_config, dict):
        yield f"{field}={env_config!r} must be a dict of the environment's constructor arguments."
        return
    accepted = env_arguments(env) if is_known_env(env) else None
    if accepted is not None and set(env_config) - accepted:
        yield (
            f"{field} has unknown keys {sorted(set(env_config) - accepted)} for {env!r}; accepted: {sorted(accepted)}."
        )
    elif isinstance(env, str) and (env in BUILT_IN_TEXT_ENVS or env in (REMOTE_ENV_ID, TRL_ENV_ID)):
        # The built-in environments check their arguments' types and ranges when built (cheaply: no level is drawn
        # before a reset): build one here, so a bad value is named now rather than in a worker at build time. A TRL
        # class is built too (with no arguments, as TRL builds it): its contract and its import path are checked.
        try:
            make_text_env(env, **env_config).close()
        except (ValueError, TypeError, ImportError, AttributeError) as error:
            yield f"{field} for {env!r}: {type(error).__name__ + ': ' if env == TRL_ENV_ID else ''}{error}"


def _entry_errors(where: str, item, count_key: str, required: bool):
    """The errors of one ``train_envs`` / ``validation_envs`` entry, each naming ``where`` it is."""
    field = where.split("[")[0]
    if not isinstance(item, dict):
        yield f"{where}={item!r} must be a dict with keys {list(ENV_ENTRY_KEYS[field])}."
        return
    unknown = set(item) - set(ENV_ENTRY_KEYS[field])
    if unknown:
        yield f"{where} has unknown keys {sorted(unknown)}; accepted: {list(ENV_ENTRY_KEYS[field])}."
    if "env" not in item or not is_known_env(item["env"]):
        yield (
            f"{where}['env']={item.get('env')!r} is not a registered text environment; pick one of "
            f"{registered_text_envs()} or register yours with rllib_ragen.register_text_env."
        )
    else:
        yield from env_config_errors(f"{where}['env_config']", item["env"], item.get("env_config", {}))
    if "name" in item and (not isinstance(item["name"], str) or not item["name"]):
        yield f"{where}['name']={item['name']!r} must be a non-empty string."
    if required and count_key not in item:
        yield f"{where} needs {count_key!r}: the groups of this environment in each training step."
    elif count_key in item and (not is_int(item[count_key]) or item[count_key] < 1):
        yield f"{where}[{count_key!r}]={item[count_key]!r} must be a positive integer."
    elif count_key == "states" and item.get(count_key, 0) > MAX_VALIDATION_STATES:
        yield (
            f"{where}['states']={item[count_key]} must be at most {MAX_VALIDATION_STATES} (a validation plays its "
            "states in one rollout, held in memory: play more in parts, each from its own validation_seed_start)."
        )


def environment_errors(config):
    """``env`` and ``env_config``; ``train_envs`` and ``validation_envs``: each entry's keys, environment and count;
    unique names; the training groups adding up to ``num_groups``; ``env`` being the first training environment."""
    if not is_known_env(config.env):
        yield (
            f"env={config.env!r} is not a registered text environment; pick one of {registered_text_envs()} "
            "or register yours with rllib_ragen.register_text_env."
        )
    yield from env_config_errors("env_config", config.env, config.env_config)
    yield from mixture_errors(config)
    yield from curriculum_errors(config)


CURRICULUM_STAGE_KEYS = {"iterations", "env_config"}


def curriculum_errors(config):
    """Each stage's keys, length, and ``env_config`` (checked as ``env`` will be built with it); one environment."""
    stages = config.curriculum
    if stages is None:
        return
    if not isinstance(stages, (list, tuple)) or not stages:
        yield (
            f'curriculum={stages!r} must be a non-empty list of stages {{"iterations": n, "env_config": '
            "{...}}, or None."
        )
        return
    if config.train_envs is not None:
        yield (
            "curriculum changes env's env_config, but train_envs trains on several environments: give the "
            "easier settings as a train_envs entry of their own instead, or drop train_envs."
        )
    for i, stage in enumerate(stages):
        where = f"curriculum[{i}]"
        if not isinstance(stage, dict):
            yield f"{where}={stage!r} must be a dict with exactly the keys ['iterations', 'env_config']."
            continue
        # Every value given is judged, then what is missing or unknown: [{"iterations": 0}] names the zero first.
        if "iterations" in stage and (not is_int(stage["iterations"]) or stage["iterations"] < 1):
            yield f"{where}['iterations']={stage['iterations']!r} must be a positive integer: the stage's length."
        if "env_config" in stage and (not isinstance(stage["env_config"], dict) or not stage["env_config"]):
            yield f"{where}['env_config']={stage['env_config']!r} must be a non-empty dict of settings to change."
        elif "env_config" in stage and not next(
            env_config_errors("env_config", config.env, config.env_config), None
        ):  # (env_config's own errors are reported above)
            yield from env_config_errors(
                f"{where}['env_config']", config.env, {**config.env_config, **stage["env_config"]}
            )
        missing, unknown = sorted(CURRICULUM_STAGE_KEYS - set(stage)), sorted(set(stage) - CURRICULUM_STAGE_KEYS)
        if missing or unknown:
            yield (
                f"{where}={stage!r}"
                + (f" lacks {missing}" if missing else "")
                + (" and" if missing and unknown else "")
                + (f" has unknown keys {unknown}" if unknown else "")
                + ': a stage is {"iterations": n, "env_config": {...}}.'
            )


def mixture_errors(config):
    entries = {}
    for field, count_key in (("train_envs", "groups"), ("validation_envs", "states")):
        items = getattr(config, field)
        if items is None:
            continue
        if not isinstance(items, (list, tuple)) or not items:
            yield f"{field}={items!r} must be a non-empty list of dicts (see StarPOConfig.environment), or None."
            continue
        errors = []
        for i, item in enumerate(items):
            errors += _entry_errors(f"{field}[{i}]", item, count_key, required=field == "train_envs")
        yield from errors
        if errors:
            continue
        entries[field] = [entry(item, count_key, config.validation_size) for item in items]
        names = [e.name for e in entries[field]]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            yield (
                f"{field}: the names {repeated} are used twice; give each entry of one id its own "
                '"name" (metrics and outputs tell them apart by it).'
            )
    if entries.get("train_envs"):
        training = entries["train_envs"]
        total = sum(e.count for e in training)
        if total != config.num_groups:
            yield (
                f"train_envs: the groups add up to {total}, but num_groups={config.num_groups}; set "
                f"num_groups={total} in .training() or change the groups."
            )
        if (config.env, dict(config.env_config)) != (training[0].env, training[0].env_config):
            yield (
                f"env={config.env!r} (env_config={dict(config.env_config)}) is not train_envs[0] "
                f"({training[0].env!r}, {training[0].env_config}): with train_envs, env is the first training "
                "environment; leave env out of .environment(train_envs=...)."
            )
    by_name = {}
    for e in entries.get("train_envs", []) + entries.get("validation_envs", []):
        if by_name.setdefault(e.name, (e.env, e.env_config)) != (e.env, e.env_config):
            yield (
                f"the name {e.name!r} stands for two different environments in train_envs and validation_envs;"
                " one name, one environment (its metrics would mix)."
            )


class ConfigEnvironments:
    """What a StarPO config trains and validates on, read from its settings (a part of
    :class:`~rllib_ragen.starpo.config.StarPOConfig`)."""

    def training_environments(self) -> list[EnvEntry]:
        """What each training step plays: ``env`` alone (``num_groups`` groups), or the ``train_envs`` mixture."""
        if self.train_envs is None:
            return [EnvEntry(env_name(self.env), self.env, dict(self.env_config), self.num_groups)]
        return [entry(item, "groups", None) for item in self.train_envs]

    def validation_environments(self) -> list[EnvEntry]:
        """What validation plays: ``validation_envs``, else every training environment, ``validation_size``
        states each."""
        if self.validation_envs is None:
            return [dataclasses.replace(e, count=self.validation_size) for e in self.training_environments()]
        return [entry(item, "states", self.validation_size) for item in self.validation_envs]

    @property
    def env_name(self) -> str:
        """The name of the (first) training environment in metrics: ``<env_name>/success``."""
        return self.training_environments()[0].name

    @property
    def is_mixture(self) -> bool:
        """Whether rollouts name their environment in each start (``(name, seed)``) rather than playing ``env``."""
        return self.train_envs is not None or self.validation_envs is not None

    def training_starts(self, seeds: Sequence[int]) -> list[Start]:
        """A training step's group starts from its ``num_groups`` fresh seeds: the seeds themselves for one
        environment; for a mixture, ``(name, seed)``, each environment taking its groups in ``train_envs`` order."""
        if not self.is_mixture:
            return [int(s) for s in seeds]
        names = [e.name for e in self.training_environments() for _ in range(e.count)]
        return [(name, int(seed)) for name, seed in zip(names, seeds, strict=True)]

    def curriculum_stage(self, iteration: int) -> int:
        """The curriculum stage of training iteration ``iteration`` (0-based): the index of its stage, or the
        number of stages once they are over (0 without a curriculum)."""
        end = 0
        for stage, item in enumerate(self.curriculum or []):
            end += item["iterations"]
            if iteration < end:
                return stage
        return len(self.curriculum or [])

    def training_env_config(self, iteration: int) -> dict | None:
        """What the training rollout of ``iteration`` passes ``env``: ``env_config`` updated by its curriculum
        stage's, or None when it plays ``env_config`` as given."""
        stage = self.curriculum_stage(iteration)
        if stage == len(self.curriculum or []):
            return None
        return {**self.env_config, **self.curriculum[stage]["env_config"]}

    def validation_starts(self) -> list[Start]:
        """The fixed validation starts: ``states`` seeds from ``validation_seed_start`` per validation environment."""
        entries = self.validation_environments()
        seeds = {e.name: range(self.validation_seed_start, self.validation_seed_start + e.count) for e in entries}
        if not self.is_mixture:
            return [int(s) for s in seeds[entries[0].name]]
        return [(e.name, int(seed)) for e in entries for seed in seeds[e.name]]
