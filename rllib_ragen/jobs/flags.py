"""Command-line flags of a main job, generated from its ``StarPOConfig`` and its ``JobSettings`` (``settings.py``).

Every knob of ``starpo/knobs.py`` is a flag (``num_groups`` -> ``--num-groups``) in its table section, with the
help text of its entry in ``StarPOConfig.training``'s docstring and the job's own value as the default; so are the
RLlib fields a job needs (learning rate, environment, model, seed, resources) and the driver's settings. There is
no second list of knobs to keep in step: a row in the table, documented in ``training``, is a flag.

Precedence, lowest first: the job's config; ``--preset``; with a GPU preset (``ragen-gpu``, ``smollm2-gpu``) its
job settings (``GPU_PRESET_JOBS``) and the job's own settings for it (``job_presets``); then every other flag given.
A visible GPU changes nothing by itself. The result is validated; a bad value exits
with code 2 and ``validate()``'s message, which names the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import json
import re
import sys
from typing import Any

from .console import keep_notices_off_the_console
from .settings import JobSettings, job_setting_rows
from ..hardware import cpu_computes_bfloat16
from ..starpo.presets import PRESETS, PRESET_LABEL, preset_flags


# The GPU presets (of PRESETS) and their job settings, laid over the job's own. ragen-gpu: RAGEN's run length, and
# no warm start (RAGEN starts from the instruct model). smollm2-gpu: the warm start in bfloat16, and a trial that ends
# within 5 minutes of training, so that a whole run (Ray, warm start, report) stays under 9 minutes on one GPU; the
# iterations are a cap the budget meets first.
GPU_PRESET_JOBS: dict[str, dict[str, Any]] = {
    "ragen-gpu": {"iterations": 200, "warm_start_steps": 0},
    "smollm2-gpu": {"iterations": 200, "max_minutes": 5.0, "warm_start_precision": "bfloat16"},
}


# The CPU presets' job settings, laid over the job's own as the GPU presets' are. smollm2-cpu: a short warm start that
# teaches the reply format (SmolLM2 already reads text), every weight but the tied embeddings trained (LoRA adapters at
# rank 16 and lr 1e-3 left SmolLM2 weaker and RL did not lift it: the FrozenLake results page), in bfloat16 where the
# CPU computes it natively, each layer re-run in the backward pass (the same weights in less memory), two rows a pass
# (with the embeddings fixed, the job's driver then stays within 4 GB: the Benchmarks page), and a number of
# iterations, the same on every machine: a time budget held far fewer on a CPU without AMX, and the seeds that learned
# had more (the FrozenLake results page).
CPU_PRESET_JOBS: dict[str, dict[str, Any]] = {
    "smollm2-cpu": {
        "iterations": 40,
        "warm_start_steps": 75,
        "warm_start_episodes": 1200,
        "warm_start_lr": 1e-4,
        "warm_start_average_decay": 0.0,
        "warm_start_micro_batch_size": 2,
        "warm_start_group_by_length": True,
        "warm_start_activation_checkpointing": True,
        "warm_start_freeze_embeddings": True,
        "warm_start_precision": "bfloat16" if cpu_computes_bfloat16() else "float32",
    }
}


PRESET_JOBS = {**GPU_PRESET_JOBS, **CPU_PRESET_JOBS}  # every preset's job settings


# --quick: each setting at most this (the config's validation too, and only before and after the run).
# The warm start is cut too (cached under its own settings: a full run still trains the job's own), to enough steps
# for the replies to take the format: Sokoban's own took 8 of a --quick run's 10 minutes.
QUICK_JOB = {"iterations": 3, "warm_start_steps": 60, "warm_start_episodes": 256}


QUICK_VALIDATION_SIZE = 32


# RLlib's own fields (and the model's) that a job sets: flag -> (config setter, argument, help).
RLLIB_FLAGS: dict[str, tuple[str, str, str]] = {
    # The mixtures come before --env: train_envs sets env to its first entry, and a different --env is then refused.
    "train_envs": (
        "environment",
        "train_envs",
        'train on several environments at once, as JSON: \'[{"env": '
        '"rllib_ragen/Sokoban-v0", "groups": 6}, {"env": '
        '"rllib_ragen/FrozenLake-v0", "groups": 2}]\' (groups add up to '
        "num_groups; null: env alone)",
    ),
    "validation_envs": (
        "environment",
        "validation_envs",
        'validate on these environments, as JSON: \'[{"env": "rllib_ragen/FrozenLake-v0", '
        '"states": 64}]\' (null: the training ones)',
    ),
    "curriculum": (
        "environment",
        "curriculum",
        'easier training settings first, as JSON stages: \'[{"iterations": '
        '20, "env_config": {"max_solution_moves": 2}}]\' updates env_config '
        "for the first 20 iterations' rollouts (null: none)",
    ),
    "env": ("environment", "env", "registered text-environment id"),
    "env_config": (
        "environment",
        "env_config",
        'environment constructor arguments as JSON, e.g. \'{"reward": "success"}\'',
    ),
    "model": ("rl_module", "model", "'tiny', 'smollm2-135m', or a Hugging Face id / local path"),
    "dtype": ("rl_module", "dtype", "parameter dtype: 'float32' or 'bfloat16'"),
    "critic": ("rl_module", "critic", "'separate' (a value model, RAGEN's) or 'head' (a value head)"),
    "lora": (
        "rl_module",
        "lora",
        'LoRA adapters as JSON, e.g. \'{"r": 16, "alpha": 32}\' (needs peft; null: train every weight)',
    ),
    "activation_checkpointing": (
        "rl_module",
        "activation_checkpointing",
        "keep only each layer's input in an "
        "update and run the layer again in its backward pass: the same weights to the bit "
        "in less memory, for slower updates",
    ),
    "lr": ("training", "lr", "the actor's learning rate"),
    "gamma": ("training", "gamma", "discount (1.0: trajectory-level credit)"),
    "grad_clip": ("training", "grad_clip", "global-norm gradient clip of actor and critic, each (null: none)"),
    "minibatch_size": (
        "training",
        "minibatch_size",
        "trajectories per optimizer step (null: the kept batch split into updates_per_rollout_batch steps)",
    ),
    "num_epochs": ("training", "num_epochs", "passes over each rollout batch"),
    "seed": ("debugging", "seed", "seeds the model init, warm start, rollouts and updates"),
    "num_env_runners": ("env_runners", "num_env_runners", "remote env runners (0: sample in the driver process)"),
    "num_learners": ("learners", "num_learners", "remote learners (0: learn in the driver process)"),
    "num_gpus_per_learner": ("learners", "num_gpus_per_learner", "GPUs per learner"),
    "num_gpus_per_env_runner": (
        "env_runners",
        "num_gpus_per_env_runner",
        "GPUs per env runner: the Hugging Face backend generates on it (vLLM engines take their own)",
    ),
}


def training_knob_help() -> dict[str, str]:
    """Each knob's entry in ``StarPOConfig.training``'s ``Args:`` section, one line (``a, b: text`` serves both),
    as ``docstring_parser`` reads Google-style docstrings."""
    import docstring_parser

    from ..starpo.config import StarPOConfig

    doc = docstring_parser.parse(
        inspect.getdoc(StarPOConfig.training) or "", style=docstring_parser.DocstringStyle.GOOGLE
    )
    entries: dict[str, str] = {}
    for param in doc.params:
        text = " ".join((param.description or "").split()).replace("``", "")
        for name in param.arg_name.split(", "):
            entries[name] = text
    return entries


def config_value(config, name: str) -> Any:
    """The value of flag ``name`` in ``config``."""
    if name in RLLIB_FLAGS:
        setter, argument, _ = RLLIB_FLAGS[name]
        if setter == "rl_module":
            return config.model_config[argument]
        return getattr(config, argument)
    return getattr(config, name)


def set_config_value(config, name: str, value: Any) -> None:
    """Set flag ``name`` to ``value`` through the config's own setter (so the setter's merging rules apply)."""
    if name in RLLIB_FLAGS:
        setter, argument, _ = RLLIB_FLAGS[name]
        if setter == "rl_module":  # rl_module replaces model_config: pass the others on unchanged
            config.rl_module(model_config={**user_model_config(config), argument: value})
        else:
            getattr(config, setter)(**{argument: value})
    else:
        config.training(**{name: value})


def user_model_config(config) -> dict[str, Any]:
    """The model settings the user chose: ``model_config`` without the keys the config derives itself."""
    derived = config._model_config_auto_includes
    return {k: v for k, v in config.model_config.items() if k not in derived}


def config_flag_names() -> list[str]:
    from ..starpo.knobs import KNOBS

    return list(RLLIB_FLAGS) + list(KNOBS)


def parse_job_args(
    config,
    job: JobSettings,
    argv: list[str] | None = None,
    *,
    job_presets: dict | None = None,
    description: str | None = None,
):
    """Flags over the job's ``config`` and ``job`` settings; returns ``(config, job)``, validated, both new objects.

    Args:
        config: the job's ``StarPOConfig`` (not modified).
        job: the job's :class:`JobSettings` (not modified).
        argv: the flags (default: ``sys.argv[1:]``).
        job_presets: the job's own settings under a preset (``PRESET_JOBS``), by preset name: with
            ``--preset NAME``, ``job_presets[NAME](config)`` is called after the preset; it changes ``config``
            (e.g. a harder environment variant) and returns the job settings it changes (a dict, or None).
        description: the ``--help`` headline.
    """
    parser = job_parser(config, job, description)
    return apply_job_args(parser, parser.parse_args(argv), config, job, job_presets=job_presets)


# What ``--help`` shows: the flags a user changes first. ``--help-all`` adds every other flag, by section.
FIRST_FLAGS = (
    "quick",
    "preset",
    "output_dir",
    "iterations",
    "max_minutes",
    "seeds",
    "grid",
    "resume",
    "run_name",
    "verbose",
    "model",
    "env",
    "lr",
    "seed",
    "num_groups",
    "group_size",
    "max_turns",
    "validation_size",
    "validation_interval",
    "advantage_estimator",
)
# The sections of RLlib's own fields, by the config setter they go through.
RLLIB_SECTIONS = {
    "environment": "environment and model",
    "rl_module": "environment and model",
    "training": "RLlib training fields",
    "debugging": "RLlib training fields",
    "env_runners": "resources",
    "learners": "resources",
}
# A negative number argparse would take for an option: it knows -1 and -.5, not -1e-4 or -inf.
_NEGATIVE_NUMBER = re.compile(r"-(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|-inf(?:inity)?", re.IGNORECASE)


class JobArgumentParser(argparse.ArgumentParser):
    """The parser of a job's flags: ``--help`` lists the flags a user changes first (:data:`FIRST_FLAGS`),
    ``--help-all`` every flag by section; and a negative number is a value (``--lr -1e-4``), as it reads."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, usage="%(prog)s [FLAG VALUE ...]  (--help-all: every flag)", **kwargs)
        self.show_every_flag = False
        self.add_argument("--help-all", action=_HelpAll, help="show every flag, by section, and exit")

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        joined, i = [], 0
        while i < len(args):  # "--lr -1e-4" -> "--lr=-1e-4", for flags that take one value
            action = self._option_string_actions.get(args[i])
            if (
                action is not None
                and action.nargs is None
                and i + 1 < len(args)
                and _NEGATIVE_NUMBER.fullmatch(args[i + 1])
            ):
                joined.append(f"{args[i]}={args[i + 1]}")
                i += 2
            else:
                joined.append(args[i])
                i += 1
        return super().parse_known_args(joined, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:  # argparse's own message, and the nearest flag to each unknown one
            hints = [
                f"{flag} -> did you mean {match[0]}?"
                for flag in unknown
                if flag.startswith("--")
                for match in [
                    difflib.get_close_matches(flag.split("=")[0], list(self._option_string_actions), n=1, cutoff=0.6)
                ]
                if match
            ]
            self.error(f"unrecognized arguments: {' '.join(unknown)}" + ("; " + "; ".join(hints) if hints else ""))
        return parsed

    def format_help(self) -> str:
        if self.show_every_flag:
            return super().format_help()
        hidden = [a for a in self._actions if a.dest not in (*FIRST_FLAGS, "help", "help_all")]
        texts = [a.help for a in hidden]
        try:
            for action in hidden:  # argparse drops a section whose flags are all suppressed
                action.help = argparse.SUPPRESS
            return super().format_help()
        finally:
            for action, text in zip(hidden, texts):
                action.help = text


class _HelpAll(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.show_every_flag = True
        parser.print_help()
        parser.exit()


def job_parser(config, job: JobSettings, description: str | None = None) -> argparse.ArgumentParser:
    """The parser of every job and config flag, defaults from ``config`` and ``job``, grouped: the flags a user
    changes first, then by section. Add a script's own flags to it, then hand what it parsed to
    :func:`apply_job_args`."""
    from ..starpo.knobs import KNOB_SECTIONS

    help_texts = training_knob_help()
    undocumented = [name for name in config_flag_names() if name not in RLLIB_FLAGS and not help_texts.get(name)]
    if undocumented:  # a knob without its docstring entry would be a flag without help
        raise RuntimeError(f"StarPOConfig.training's docstring has no 'Args:' entry for {undocumented}.")
    parser = JobArgumentParser(description=description or f"StarPO on {config.env}")
    first = parser.add_argument_group("the flags to change first (--help-all: every flag)")
    groups: dict[str, Any] = {}

    def group(title: str, name: str):
        return first if name in FIRST_FLAGS else groups.setdefault(title, parser.add_argument_group(title))

    group("presets", "preset").add_argument(
        "--preset",
        default=argparse.SUPPRESS,
        help="named settings applied before the other flags: 'starpo-s' (the library's defaults: filter, critic, no "
        "KL, clip-higher), 'starpo' (vanilla), 'smollm2-cpu' (SmolLM2-135M-Instruct with LoRA on this CPU, "
        "bfloat16 where it computes it natively, a seed in about 45 minutes on 2 cores), or on one GPU "
        "'ragen-gpu' (RAGEN's model and scale) or 'smollm2-gpu' (SmolLM2-135M-Instruct, runs of a few minutes); "
        "none by default",
    )
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(JobSettings)}
    for row in job_setting_rows():
        _add_flag(group(row.section, row.name), row.name, getattr(job, row.name), helps[row.name])
    for name, (setter, _, text) in RLLIB_FLAGS.items():
        _add_flag(group(RLLIB_SECTIONS[setter], name), name, config_value(config, name), text)
    for section, knobs in KNOB_SECTIONS.items():
        for name in knobs:
            _add_flag(group(f"StarPO: {section}", name), name, config_value(config, name), help_texts[name])
    return parser


def apply_job_args(
    parser: argparse.ArgumentParser,
    namespace: argparse.Namespace,
    config,
    job: JobSettings,
    *,
    job_presets: dict | None = None,
):
    """Lay the parsed flags over copies of ``config`` and ``job`` (see the module docstring for the order) and
    validate; a bad value exits through ``parser.error`` with ``validate()``'s message. ``job_presets``: the
    job's own settings under each GPU preset (:func:`parse_job_args`)."""
    config = config.copy(copy_frozen=False)
    job_fields = {f.name for f in dataclasses.fields(JobSettings)}
    given = vars(namespace)  # flags not given are absent (SUPPRESS): a given null is a value, None
    # GPU settings come only from an explicit GPU preset: a visible GPU changes nothing by itself.
    preset = given.get("preset")
    gpu = preset in GPU_PRESET_JOBS
    try:
        if preset is not None:
            config.preset(preset)
        job_settings = dict(PRESET_JOBS.get(preset, {}))
        if preset in (job_presets or {}):
            job_settings.update(job_presets[preset](config) or {})
    except ValueError as error:
        parser.error(str(error))
    job = dataclasses.replace(job, **job_settings)
    job = dataclasses.replace(job, **{k: v for k, v in given.items() if k in job_fields})
    if job.quick:
        job = dataclasses.replace(job, **{k: min(getattr(job, k), v) for k, v in QUICK_JOB.items() if k not in given})
    if job.timed_command and "timed_command" not in given:  # the table times the command as the user ran it
        flags = [*(["--preset", preset] if preset else []), *(["--quick"] if job.quick else [])]
        job = dataclasses.replace(job, timed_command=" ".join([job.timed_command, *flags]))
    if job.verbose is False:  # RLlib's API-stack notice comes at validate(): hold it for the run's job.log
        keep_notices_off_the_console()
    grid_presets = (job.grid or {}).get(PRESET_LABEL, []) if isinstance(job.grid, dict) else []
    overlap = sorted({f for name in grid_presets if name in PRESETS for f in preset_flags(name)} & set(given))
    if grid_presets and ("preset" in given or overlap):  # the grid's preset would silently win over the flag
        parser.error(
            f"--grid varies the preset, which sets {overlap or ['every preset field']}; drop "
            f"--{(overlap or ['preset'])[0].replace('_', '-')} or take that preset out of the grid."
        )
    try:
        if job.quick and "validation_interval" not in given:
            set_config_value(config, "validation_interval", 0)
        if job.quick and "validation_size" not in given and not config.validation_envs:
            set_config_value(config, "validation_size", min(config.validation_size, QUICK_VALIDATION_SIZE))
        for name in config_flag_names():
            if name in given:
                set_config_value(config, name, given[name])
        if (
            gpu
            and config.inference_backend == "hf"
            and config.num_env_runners == 0
            and "num_gpus_per_env_runner" not in given
        ):
            config.env_runners(num_gpus_per_env_runner=1)  # the preset's: the driver samples on its GPU
        config.validate()
        job.validate(config)
    except ValueError as error:
        parser.error(str(error))
    return config, job


def _add_flag(group, name: str, default: Any, text: str) -> None:
    """``--name`` parsing its value like ``default``: a switch for booleans, JSON for dicts, tuples and None."""
    flag = "--" + name.strip("_").replace("_", "-")  # lambda_ -> --lambda
    as_json = isinstance(default, (dict, list, tuple, type(None)))  # shown as the flag takes it
    shown = f"{text} (default: {json.dumps(default) if as_json or default == '' else default})"
    unset = argparse.SUPPRESS  # a flag not given leaves no attribute, so `--dual-clip null` can set None
    if isinstance(default, bool):
        group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=unset, help=shown)
    elif isinstance(default, (int, float, str)):
        group.add_argument(
            flag,
            dest=name,
            type=_parser_like(type(default)),
            default=unset,
            metavar=type(default).__name__.upper(),
            help=shown,
        )
    else:
        group.add_argument(flag, dest=name, type=_parser_like(type(default)), default=unset, metavar="JSON", help=shown)


def _parser_like(kind: type):
    """Parse a flag's text as a value of ``kind``; ``null`` is None for every knob that may be None."""

    def parse(text: str):
        if text.lower() in ("null", "none"):
            return None
        if kind in (int, float, str):
            try:
                # An int knob may take a float (num_gpus_per_learner=0.5); validate() refuses where it must not.
                return float(text) if kind is int and not text.lstrip("+-").isdigit() else kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not a valid {kind.__name__}: {text!r}") from None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            if kind is type(None):  # a knob that is None by default may take a word: --autocast-dtype bfloat16
                return text
            raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
        if kind is dict and not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"key\": 1}}', got {text!r}")
        return tuple(value) if kind is tuple and isinstance(value, list) else value

    return parse
