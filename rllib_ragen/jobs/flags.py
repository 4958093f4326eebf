"""Command-line flags of a main job, generated from its ``StarPOConfig`` and its :class:`JobSettings`.

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
import importlib.util
import inspect
import json
import os
import pathlib
import re
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .job_times import JOB_TIMES
from .outputs import LATEST
from .console import keep_notices_off_the_console
from ..hardware import cpu_computes_bfloat16
from ..ranges import AT_LEAST_ONE, BELOW_ONE, NON_NEGATIVE, POSITIVE, Range
from ..warm_start import LR_SCHEDULES, WARM_START_PRECISIONS
from ..starpo.config import PRESET_LABEL, PRESETS, VARIANT_LABEL, preset_flags
from ..starpo.knobs import BOOL, CHOICE, INT, NUMBER, OTHER, RLLIB_FIELDS, Knob, is_int


def cuda_devices_seen() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _experiment_state_errors(run: pathlib.Path) -> list[str]:
    """What makes a run folder's Tune state unusable for a resume. Tune, given a cut state file (a full disk, a
    kill while it wrote), logs "Failed to restore the run state" and starts a new trial from empty settings; an
    empty or cut ``tuner.pkl`` fails inside its unpickler. Both are refused here, naming the file."""
    errors = []
    tuner = run / "tuner.pkl"
    if not tuner.is_file() or tuner.stat().st_size == 0:
        errors.append(f"resume=True: {tuner} is missing or empty, so Tune cannot rebuild the run (a full disk or a "
                      "kill while it was written?). The trials' checkpoints are in their folders; start a new run.")
    states = sorted(run.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        errors.append(f"resume=True: {run} has no experiment_state-*.json: Tune would start every trial afresh.")
        return errors
    try:
        trials = json.loads(states[-1].read_text()).get("trial_data")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
        return errors + [f"resume=True: {states[-1]} cannot be read ({type(error).__name__}: {error}): a full disk "
                         "or a kill while it was written? Tune would start a trial from empty settings instead of "
                         "continuing; nothing was resumed."]
    if not trials:
        errors.append(f"resume=True: {states[-1]} lists no trial: Tune would start a trial from empty settings.")
    return errors


def _setting(help: str, default: Any, kind: str, range: Range | None = None, **details) -> Any:
    """A job setting's one declaration: its help, default, and the kind and range its value is checked against
    (a :class:`~rllib_ragen.starpo.knobs.Knob` row, as StarPO's knobs are)."""
    return field(default=default, metadata={"help": help, "row": dict(kind=kind, range=range, **details)})


def peft_installed() -> bool:
    """Whether peft, which LoRA needs, is installed (the job layer does not import the rollout layer's check)."""
    return importlib.util.find_spec("peft") is not None


def _warm_start_device_error(device) -> str | None:
    if isinstance(device, str) and re.fullmatch(r"learner|cpu|cuda(:\d+)?", device):
        return None
    return f"warm_start_device={device!r}: choose 'learner', 'cpu', 'cuda' or 'cuda:N'."


def _run_name_error(name) -> str | None:
    if isinstance(name, str) and "/" not in name and name not in (".", "..", "latest"):
        return None
    return f"run_name={name!r} must be a plain folder name (not 'latest'), or empty."


def _timed_command_error(command) -> str | None:
    scripts = sorted({c.split()[0] for c in JOB_TIMES})
    if isinstance(command, str) and (command == "" or command.split()[0] in scripts):
        return None  # a command the table lacks (other flags) states no time
    return (f"timed_command={command!r} does not start with a tuned example of rllib_ragen.jobs.job_times.JOB_TIMES "
            f"({', '.join(scripts)}); give one, or ''.")


def _output_dir_error(path) -> str | None:
    return None if isinstance(path, str) and path else f"output_dir={path!r} must be a folder path."


SENTINEL_CHOICES = ("warn", "stop", "rollback", "off")


@dataclass
class JobSettings:
    """What the driver itself needs; the method's settings are the job's ``StarPOConfig``. Each field is declared
    once, with its help, default, kind and range (:func:`job_setting_rows`); ``validate()`` adds the rules that
    read the config, the machine or the disk."""

    output_dir: str = _setting("the job's folder: each run writes its metrics, plots, rollouts and model to a folder "
                               "of its own inside it", "outputs/starpo", OTHER, check=_output_dir_error,
                               check_is_kind=True)
    iterations: int = _setting("StarPO training iterations (one rollout batch and update each)", 20, INT, AT_LEAST_ONE)
    threads: int = _setting("torch threads (and CPUs) of each trial and of the warm start (0: the warm start, which "
                            "runs alone first, takes every CPU; the trials then share them)", 0, INT, NON_NEGATIVE)
    seeds: str = _setting("run one trial per seed, e.g. '0,1,2', and report their spread (empty: the config's "
                          "seed); the trials share one warm start and run side by side where the CPUs allow", "",
                          OTHER)  # checked by seed_list
    grid: dict = _setting("a sweep: one trial per combination of these config values, as JSON, e.g. "
                          "'{\"lr\": [1e-4, 3e-4]}', of presets, '{\"preset\": [\"starpo\", \"starpo-s\"]}', or of "
                          "named settings, '{\"variant\": {\"small\": {\"lr\": 1e-4}, \"large\": {\"lr\": 3e-4}}}'; "
                          "the report pairs each trial against the trial of the grid's first values (null: none)",
                          None, OTHER)  # checked by _grid_errors, point by point against the config
    max_failures: int = _setting("restart a failed trial from its last checkpoint up to this many times (Tune's "
                                 "FailureConfig)", 0, INT, NON_NEGATIVE)
    warm_start_episodes: int = _setting("demonstration episodes for the supervised warm start (0: none)", 512, INT,
                                        NON_NEGATIVE)
    warm_start_steps: int = _setting("supervised warm-start steps (0: start RL from the model as loaded)", 200, INT,
                                     NON_NEGATIVE)
    warm_start_lr: float = _setting("warm-start learning rate", 2e-3, NUMBER, POSITIVE)
    warm_start_batch_size: int = _setting("warm-start batch size (episodes)", 16, INT, AT_LEAST_ONE)
    warm_start_average_decay: float = _setting("end the warm start on an exponential moving average of its weights "
                                               "with this decay per step, e.g. 0.98 (0: the last step's weights)",
                                               0.0, NUMBER, BELOW_ONE, why=" (0: no averaging)")
    warm_start_lr_schedule: str = _setting("warm-start learning rate over the steps: 'constant' or 'cosine' (from "
                                           "--warm-start-lr down towards 0)", "constant", CHOICE,
                                           options=LR_SCHEDULES)
    warm_start_max_turns: int = _setting("turns a demonstration episode may run, at most the config's max_turns "
                                         "(0: max_turns); fewer keeps the demonstrations short when RL gets more "
                                         "turns than the warm start should show", 0, INT, NON_NEGATIVE)
    warm_start_group_by_length: bool = _setting("batch warm-start demonstrations of similar length together: less "
                                                "padding, up to half the time per step; judge it by validation "
                                                "success", False, BOOL)
    warm_start_micro_batch_size: int = _setting("rows per forward and backward pass of a warm-start step, their "
                                                "gradients summed into the step's: the same step in less memory "
                                                "(0: the whole batch in one pass)", 0, INT, NON_NEGATIVE)
    warm_start_activation_checkpointing: bool = _setting(
        "keep only each layer's input in a warm-start step and run the layer again in its backward pass: the same "
        "weights to the bit in less memory, for longer steps (figures: the Benchmarks page)", False, BOOL)
    warm_start_lora_rank: int = _setting("train rank-r LoRA adapters on every linear layer in the warm start and fold "
                                         "them into the weights at its end: no gradients or AdamW moments for the "
                                         "frozen weights (SmolLM2: 1.6 GB less); needs peft (0: train every weight)",
                                         0, INT, NON_NEGATIVE)
    warm_start_precision: str = _setting("the warm start's forward pass: 'float32', or 'bfloat16' autocast "
                                         "(weights, optimizer and loss stay float32; faster on a CPU that computes "
                                         "bfloat16 natively and on GPUs, slower where it is emulated: the Benchmarks "
                                         "page)", "float32", CHOICE,
                                         options=WARM_START_PRECISIONS)
    warm_start_device: str = _setting("where the warm start trains: 'learner' (the learner's device: its GPU with "
                                      "--num-gpus-per-learner 1 when this process sees one, else the CPU), 'cpu', "
                                      "or 'cuda' / 'cuda:N'", "learner", OTHER, check=_warm_start_device_error,
                                      check_is_kind=True)
    warm_start_eval_interval: int = _setting("every N warm-start steps and after the last, play the validation "
                                             "states greedily (last weights, and averaged ones with averaging) and "
                                             "write warm_start_curve.csv: see how long the warm start should run "
                                             "(0: off)", 0, INT, NON_NEGATIVE)
    max_minutes: float = _setting("end each trial early once one more iteration would run past this many minutes "
                                  "of its training time (Tune's time_total_s: iterations and validations; not the "
                                  "warm start or model loading), validated and exported as after its last "
                                  "iteration (0: no limit; --iterations still caps it)", 0.0, NUMBER, NON_NEGATIVE)
    pass_bar: float = _setting("least rise of validation success over the warm start that counts as learning",
                               0.05, NUMBER)
    checkpoint_interval: int = _setting("checkpoint each trial (Tune's checkpoint_<n>/ in its folder) every N "
                                        "iterations and after the last (0: never)", 5, INT, NON_NEGATIVE)
    run_name: str = _setting("the run's folder inside output_dir (empty: <timestamp>_seed<seed>); with --resume, "
                             "the run to continue (empty: the one output_dir/latest points at)", "", OTHER,
                             check=_run_name_error, check_is_kind=True)
    resume: bool = _setting("continue a run's unfinished trials from their last checkpoints (Tune's "
                            "Tuner.restore), iterations after that checkpoint are trained again", False, BOOL)
    verbose: bool = _setting("show library notices (RLlib, Ray, transformers) and loading bars on the console; "
                             "otherwise they go to the run folder's job.log", False, BOOL)
    sentinel: str = _setting("the built-in echo-trap rules (rllib_ragen.sentinel.echo_trap_rules) and what they do "
                             "when they fire: 'warn', 'stop', 'rollback' (restore the last healthy weights, halve "
                             "the learning rates) or 'off'; --sentinel-rules (JSON) replaces them", "warn", CHOICE,
                             options=SENTINEL_CHOICES)
    timed_command: str = _setting("the job's command in rllib_ragen.jobs.job_times.JOB_TIMES, whose measured wall "
                                  "time the plan line states for this kind of CPU ('': none); --preset and --quick "
                                  "add themselves to it", "", OTHER, check=_timed_command_error)
    quick: bool = _setting("a trial run, to see the job work end to end: 3 iterations, validation on at most 32 "
                           "states, before and after only, a warm start of at most 60 steps on 256 demonstrations (a "
                           "full run trains the job's own). Its numbers say nothing about learning. Flags given "
                           "beside it still win", False, BOOL)

    def validate(self, config=None) -> None:
        """Raise ValueError naming each field of the wrong kind or out of range, and each setting that does not fit
        ``config`` (the job's ``StarPOConfig``), the machine or the disk."""
        errors = [error for row in job_setting_rows()
                  if (error := row.kind_error(getattr(self, row.name))
                      or row.value_error(getattr(self, row.name))) is not None]
        device = self.warm_start_device
        if isinstance(device, str) and not _warm_start_device_error(device) and device.startswith("cuda") and \
                int(device.partition(":")[2] or 0) >= cuda_devices_seen():
            errors.append(f"warm_start_device={device!r}, but torch sees {cuda_devices_seen()} CUDA "
                          "device(s) in this process (the warm start runs here): choose 'cpu', 'learner' or one "
                          "it sees.")
        if config is not None and config.model_load_error():  # the driver loads the model (the warm start)
            errors.append(config.model_load_error())
        turns = self.warm_start_max_turns
        if config is not None and is_int(turns) and turns > config.max_turns:
            errors.append(f"warm_start_max_turns={turns} exceeds max_turns={config.max_turns}: demonstrations would "
                          "show turns the agent never plays. Lower it, or raise --max-turns.")
        if is_int(self.warm_start_lora_rank) and self.warm_start_lora_rank > 0 and not peft_installed():
            errors.append(f"warm_start_lora_rank={self.warm_start_lora_rank} trains LoRA adapters, which needs peft: "
                          f"pip install 'rllib_ragen[lora]', or --warm-start-lora-rank 0 to train every weight.")
        if not _output_dir_error(self.output_dir) and isinstance(self.run_name, str):
            errors += self._run_folder_errors()
        try:
            self.seed_list(config)
        except ValueError as error:
            errors.append(str(error))
        if self.grid is not None:
            errors += _grid_errors(self.grid, config)
        if errors:
            raise ValueError("Invalid JobSettings:\n  - " + "\n  - ".join(errors))

    def run_folder(self) -> pathlib.Path:
        """The folder of the run to continue (``resume``), or the named run's."""
        base = pathlib.Path(self.output_dir).resolve()
        return base / self.run_name if self.run_name else (base / LATEST).resolve()

    def _run_folder_errors(self) -> list[str]:
        """The output paths, before anything is created: a folder to write to, the run to resume, no earlier run
        under the chosen name (the new folder itself is claimed with an atomic mkdir, ``claim_run_folder``)."""
        base = pathlib.Path(self.output_dir)
        if base.exists() and not base.is_dir():
            return [f"output_dir={self.output_dir!r} is a file; choose another --output-dir."]
        if not base.exists():
            error = _folder_creation_error(base)
            if error:
                return [f"output_dir={self.output_dir!r}: {error}; choose another --output-dir."]
        if self.resume:
            from ray import tune

            if not tune.Tuner.can_restore(str(self.run_folder())):
                return [f"resume=True: there is no Tune experiment to continue at {self.run_folder()}. Give the "
                        "--output-dir of the job (its 'latest' run), or --run-name of the run."]
            return _experiment_state_errors(self.run_folder())
        elif self.run_name and (base / self.run_name).exists():
            return [f"run_name={self.run_name!r}: {base / self.run_name} holds an earlier run (or a file). Continue "
                    "it with --resume, or choose another --run-name. Nothing was overwritten."]
        return []

    def seed_list(self, config=None) -> list[int]:
        """The trials' seeds: ``seeds`` parsed, else the config's seed (0 when it has none)."""
        if not isinstance(self.seeds, str):
            raise ValueError(f"seeds={self.seeds!r} must be comma-separated integers, e.g. '0,1,2'.")
        if not self.seeds.strip():
            return [(config.seed if config is not None else None) or 0]
        try:
            seeds = [int(s) for s in self.seeds.split(",")]
        except ValueError:
            raise ValueError(f"seeds={self.seeds!r} must be comma-separated integers, e.g. '0,1,2'.") from None
        if any(seed < 0 for seed in seeds):  # RLlib drops a -1 from configs (its "deprecated value" marker)
            raise ValueError(f"seeds={self.seeds!r}: seeds must be integers >= 0.")
        seed_row = RLLIB_FIELDS["seed"]  # each trial's config.seed: checked by its row, as validate() checks it
        for seed in seeds:
            if seed_row.value_error(seed):
                raise ValueError(f"seeds={self.seeds!r}: {seed_row.value_error(seed)}")
        if len(set(seeds)) < len(seeds):
            raise ValueError(f"seeds={self.seeds!r} repeats a seed: each trial needs its own.")
        return seeds


def job_setting_rows() -> list[Knob]:
    """Each :class:`JobSettings` field as a knob row: its flag section ('warm start' or 'job'), default, kind and
    range, from its one declaration."""
    return [Knob(f.name, "warm start" if f.name.startswith("warm_start") else "job", f.default, **f.metadata["row"])
            for f in dataclasses.fields(JobSettings)]


def _folder_creation_error(path: pathlib.Path) -> str | None:
    """Why the folder ``path`` (which does not exist) could not be created, or None: its nearest existing ancestor
    is a file, or refuses new folders (a read-only or virtual file system). Probed with a folder made and removed
    at once, so nothing stays behind."""
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"it would be inside {ancestor}, which is a file"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rllib_ragen_probe_", dir=ancestor))
    except OSError as error:
        return f"no folder can be created in {ancestor} ({error.strerror or error})"
    return None


# The GPU presets (of PRESETS) and their job settings, laid over the job's own. ragen-gpu: RAGEN's run length, and
# no warm start (RAGEN starts from the instruct model). smollm2-gpu: the warm start in bfloat16, and a trial that ends
# within 5 minutes of training, so that a whole run (Ray, warm start, report) stays under 9 minutes on one GPU; the
# iterations are a cap the budget meets first.
GPU_PRESET_JOBS: dict[str, dict[str, Any]] = {
    "ragen-gpu": {"iterations": 200, "warm_start_steps": 0},
    "smollm2-gpu": {"iterations": 200, "max_minutes": 5.0, "warm_start_precision": "bfloat16"},
}
# The CPU presets' job settings, laid over the job's own as the GPU presets' are. smollm2-cpu: a short warm start that
# teaches the reply format (SmolLM2 already reads text), with LoRA adapters folded in at its end (full fine-tuning's
# gradients and AdamW moments alone were 1.6 GB), in bfloat16 where the CPU computes it natively, each layer re-run in
# the backward pass (the same weights in less memory), and a trial that ends within 30 minutes of training, so that a
# seed's whole run stays within 45 minutes on 2 cores; the iterations are a cap the budget may meet first.
CPU_PRESET_JOBS: dict[str, dict[str, Any]] = {
    "smollm2-cpu": {"iterations": 80, "max_minutes": 30.0, "warm_start_steps": 75, "warm_start_episodes": 1200,
                    "warm_start_lr": 1e-3, "warm_start_lora_rank": 16, "warm_start_average_decay": 0.0,
                    "warm_start_micro_batch_size": 4, "warm_start_group_by_length": True,
                    "warm_start_activation_checkpointing": True,
                    "warm_start_precision": "bfloat16" if cpu_computes_bfloat16() else "float32"},
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
    "train_envs": ("environment", "train_envs", "train on several environments at once, as JSON: '[{\"env\": "
                                                "\"rllib_ragen/Sokoban-v0\", \"groups\": 6}, {\"env\": "
                                                "\"rllib_ragen/FrozenLake-v0\", \"groups\": 2}]' (groups add up to "
                                                "num_groups; null: env alone)"),
    "validation_envs": ("environment", "validation_envs",
                        "validate on these environments, as JSON: '[{\"env\": \"rllib_ragen/FrozenLake-v0\", "
                        "\"states\": 64}]' (null: the training ones)"),
    "curriculum": ("environment", "curriculum", "easier training settings first, as JSON stages: '[{\"iterations\": "
                                                "20, \"env_config\": {\"max_solution_moves\": 2}}]' updates env_config "
                                                "for the first 20 iterations' rollouts (null: none)"),
    "env": ("environment", "env", "registered text-environment id"),
    "env_config": ("environment", "env_config", "environment constructor arguments as JSON, e.g. "
                                                "'{\"reward\": \"success\"}'"),
    "model": ("rl_module", "model", "'tiny', 'smollm2-135m', or a Hugging Face id / local path"),
    "dtype": ("rl_module", "dtype", "parameter dtype: 'float32' or 'bfloat16'"),
    "critic": ("rl_module", "critic", "'separate' (a value model, RAGEN's) or 'head' (a value head)"),
    "lora": ("rl_module", "lora", "LoRA adapters as JSON, e.g. '{\"r\": 16, \"alpha\": 32}' (needs peft; null: "
                                  "train every weight)"),
    "activation_checkpointing": ("rl_module", "activation_checkpointing", "keep only each layer's input in an "
                                 "update and run the layer again in its backward pass: the same weights to the bit "
                                 "in less memory, for slower updates"),
    "lr": ("training", "lr", "the actor's learning rate"),
    "gamma": ("training", "gamma", "discount (1.0: trajectory-level credit)"),
    "grad_clip": ("training", "grad_clip", "global-norm gradient clip of actor and critic, each (null: none)"),
    "minibatch_size": ("training", "minibatch_size", "trajectories per optimizer step (null: the kept batch "
                                                     "split into updates_per_rollout_batch steps)"),
    "num_epochs": ("training", "num_epochs", "passes over each rollout batch"),
    "seed": ("debugging", "seed", "seeds the model init, warm start, rollouts and updates"),
    "num_env_runners": ("env_runners", "num_env_runners", "remote env runners (0: sample in the driver process)"),
    "num_learners": ("learners", "num_learners", "remote learners (0: learn in the driver process)"),
    "num_gpus_per_learner": ("learners", "num_gpus_per_learner", "GPUs per learner"),
    "num_gpus_per_env_runner": ("env_runners", "num_gpus_per_env_runner", "GPUs per env runner: the Hugging Face "
                                                                         "backend generates on it (vLLM engines "
                                                                         "take their own)"),
}


def _grid_errors(grid, config) -> list[str]:
    """What is wrong with a job's ``grid``: its shape, and each point as its trial would build it (a bad one fails
    now, not mid-sweep)."""
    shapes_ok = isinstance(grid, dict) and all(
        isinstance(k, str) and v and (isinstance(v, dict) and all(isinstance(s, dict) for s in v.values())
                                      if k == VARIANT_LABEL else isinstance(v, list)) for k, v in grid.items())
    if not shapes_ok:
        return [f"grid={grid!r} must map config fields to non-empty lists of values, e.g. {{\"lr\": [1e-4, 3e-4]}}, "
                f"or \"{VARIANT_LABEL}\" to named settings, e.g. {{\"{VARIANT_LABEL}\": {{\"small\": {{\"lr\": 1e-4}}, "
                "\"large\": {\"lr\": 3e-4}}}."]
    variants = grid.get(VARIANT_LABEL, {})
    varied = set(grid) - {VARIANT_LABEL} | {field for settings in variants.values() for field in settings}
    if "seed" in varied:  # the seeds make trials of their own, and name each trial's folder
        seeds = ",".join(str(seed) for seed in grid.get("seed", [0, 1, 2]))
        return [f"grid varies 'seed': give the seeds as seeds (--seeds {seeds}), which runs one trial per seed for "
                "every point of the grid."]
    if PRESET_LABEL in grid and VARIANT_LABEL in grid:
        return [f"grid has both '{PRESET_LABEL}' and '{VARIANT_LABEL}': give each preset's settings as a variant "
                "instead (StarPOConfig().preset(name).to_dict() lists them)."]
    twice = sorted(set(grid) & {field for settings in variants.values() for field in settings})
    if twice:
        return [f"grid varies {twice} both as a list and in its variants: one would overwrite the other; set them "
                "in the variants only."]
    if config is None:
        return []
    unknown = sorted(varied - set(config.to_dict()) - {PRESET_LABEL})
    if unknown:
        return [f"grid names {unknown}, which are not fields of the config; use the names of StarPOConfig's fields "
                f"(e.g. lr, rollout_filter_ratio), '{PRESET_LABEL}' or '{VARIANT_LABEL}'."]
    errors = []
    for name, values in grid.items():
        for value in values:
            point = config.copy(copy_frozen=False)
            try:
                if name == PRESET_LABEL:
                    point.preset(value)
                else:
                    point.update_from_dict(values[value] if name == VARIANT_LABEL else {name: value})
                point.validate()
            except (ValueError, TypeError) as error:
                errors.append(f"grid {name}={value!r}: {error}")
    return errors


def training_knob_help() -> dict[str, str]:
    """Each knob's entry in ``StarPOConfig.training``'s ``Args:`` section, one line (``a, b: text`` serves both),
    as ``docstring_parser`` reads Google-style docstrings."""
    import docstring_parser

    from ..starpo.config import StarPOConfig

    doc = docstring_parser.parse(inspect.getdoc(StarPOConfig.training) or "",
                                 style=docstring_parser.DocstringStyle.GOOGLE)
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


def parse_job_args(config, job: JobSettings, argv: list[str] | None = None, *, job_presets: dict | None = None,
                   description: str | None = None):
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
FIRST_FLAGS = ("quick", "preset", "output_dir", "iterations", "max_minutes", "seeds", "grid", "resume", "run_name",
               "verbose", "model", "env", "lr", "seed", "num_groups", "group_size", "max_turns", "validation_size",
               "validation_interval", "advantage_estimator")
# The sections of RLlib's own fields, by the config setter they go through.
RLLIB_SECTIONS = {"environment": "environment and model", "rl_module": "environment and model",
                  "training": "RLlib training fields", "debugging": "RLlib training fields",
                  "env_runners": "resources", "learners": "resources"}
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
            if (action is not None and action.nargs is None and i + 1 < len(args)
                    and _NEGATIVE_NUMBER.fullmatch(args[i + 1])):
                joined.append(f"{args[i]}={args[i + 1]}")
                i += 2
            else:
                joined.append(args[i])
                i += 1
        return super().parse_known_args(joined, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:  # argparse's own message, and the nearest flag to each unknown one
            hints = [f"{flag} -> did you mean {match[0]}?" for flag in unknown if flag.startswith("--")
                     for match in [difflib.get_close_matches(flag.split("=")[0], list(self._option_string_actions),
                                                             n=1, cutoff=0.6)] if match]
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
        "--preset", default=argparse.SUPPRESS,
        help="named settings applied before the other flags: 'starpo-s' (the library's defaults: filter, critic, no "
             "KL, clip-higher), 'starpo' (vanilla), 'smollm2-cpu' (SmolLM2-135M-Instruct with LoRA on this CPU, "
             "bfloat16 where it computes it natively, a seed in about 45 minutes on 2 cores), or on one GPU "
             "'ragen-gpu' (RAGEN's model and scale) or 'smollm2-gpu' (SmolLM2-135M-Instruct, runs of a few minutes); "
             "none by default")
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(JobSettings)}
    for row in job_setting_rows():
        _add_flag(group(row.section, row.name), row.name, getattr(job, row.name), helps[row.name])
    for name, (setter, _, text) in RLLIB_FLAGS.items():
        _add_flag(group(RLLIB_SECTIONS[setter], name), name, config_value(config, name), text)
    for section, knobs in KNOB_SECTIONS.items():
        for name in knobs:
            _add_flag(group(f"StarPO: {section}", name), name, config_value(config, name), help_texts[name])
    return parser


def apply_job_args(parser: argparse.ArgumentParser, namespace: argparse.Namespace, config, job: JobSettings, *,
                   job_presets: dict | None = None):
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
        parser.error(f"--grid varies the preset, which sets {overlap or ['every preset field']}; drop "
                     f"--{(overlap or ['preset'])[0].replace('_', '-')} or take that preset out of the grid.")
    try:
        if job.quick and "validation_interval" not in given:
            set_config_value(config, "validation_interval", 0)
        if job.quick and "validation_size" not in given and not config.validation_envs:
            set_config_value(config, "validation_size", min(config.validation_size, QUICK_VALIDATION_SIZE))
        for name in config_flag_names():
            if name in given:
                set_config_value(config, name, given[name])
        if gpu and config.inference_backend == "hf" and config.num_env_runners == 0 \
                and "num_gpus_per_env_runner" not in given:
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
        group.add_argument(flag, dest=name, type=_parser_like(type(default)), default=unset,
                           metavar=type(default).__name__.upper(), help=shown)
    else:
        group.add_argument(flag, dest=name, type=_parser_like(type(default)), default=unset, metavar="JSON",
                           help=shown)


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
