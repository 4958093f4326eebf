"""A main job's own settings (:class:`JobSettings`: the driver's, beside the ``StarPOConfig``), each declared once
with its help, default, kind and range, and checked by ``validate()``. The presets' job settings: ``flags.py``.

``flags.py`` turns every row of this table into a flag; the docs' tables read it too.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .job_times import JOB_TIMES
from .outputs import LATEST
from ..ranges import AT_LEAST_ONE, BELOW_ONE, NON_NEGATIVE, POSITIVE, Range
from ..warm_start import LR_SCHEDULES, WARM_START_PRECISIONS
from ..starpo.presets import PRESET_LABEL, VARIANT_LABEL
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
        errors.append(
            f"resume=True: {tuner} is missing or empty, so Tune cannot rebuild the run (a full disk or a "
            "kill while it was written?). The trials' checkpoints are in their folders; start a new run."
        )
    states = sorted(run.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        errors.append(f"resume=True: {run} has no experiment_state-*.json: Tune would start every trial afresh.")
        return errors
    try:
        trials = json.loads(states[-1].read_text()).get("trial_data")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
        return errors + [
            f"resume=True: {states[-1]} cannot be read ({type(error).__name__}: {error}): a full disk "
            "or a kill while it was written? Tune would start a trial from empty settings instead of "
            "continuing; nothing was resumed."
        ]
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
    return (
        f"timed_command={command!r} does not start with a tuned example of rllib_ragen.jobs.job_times.JOB_TIMES "
        f"({', '.join(scripts)}); give one, or ''."
    )


def _output_dir_error(path) -> str | None:
    return None if isinstance(path, str) and path else f"output_dir={path!r} must be a folder path."


SENTINEL_CHOICES = ("warn", "stop", "rollback", "off")


@dataclass
class JobSettings:
    """What the driver itself needs; the method's settings are the job's ``StarPOConfig``. Each field is declared
    once, with its help, default, kind and range (:func:`job_setting_rows`); ``validate()`` adds the rules that
    read the config, the machine or the disk."""

    output_dir: str = _setting(
        "the job's folder: each run writes its metrics, plots, rollouts and model to a folder of its own inside it",
        "outputs/starpo",
        OTHER,
        check=_output_dir_error,
        check_is_kind=True,
    )
    iterations: int = _setting("StarPO training iterations (one rollout batch and update each)", 20, INT, AT_LEAST_ONE)
    threads: int = _setting(
        "torch threads (and CPUs) of each trial and of the warm start (0: the warm start, which "
        "runs alone first, takes every CPU; the trials then share them)",
        0,
        INT,
        NON_NEGATIVE,
    )
    seeds: str = _setting(
        "run one trial per seed, e.g. '0,1,2', and report their spread (empty: the config's "
        "seed); the trials share one warm start and run side by side where the CPUs allow",
        "",
        OTHER,
    )  # checked by seed_list
    grid: dict = _setting(
        "a sweep: one trial per combination of these config values, as JSON, e.g. "
        '\'{"lr": [1e-4, 3e-4]}\', of presets, \'{"preset": ["starpo", "starpo-s"]}\', or of '
        'named settings, \'{"variant": {"small": {"lr": 1e-4}, "large": {"lr": 3e-4}}}\'; '
        "the report pairs each trial against the trial of the grid's first values (null: none)",
        None,
        OTHER,
    )  # checked by _grid_errors, point by point against the config
    max_failures: int = _setting(
        "restart a failed trial from its last checkpoint up to this many times (Tune's FailureConfig)",
        0,
        INT,
        NON_NEGATIVE,
    )
    warm_start_episodes: int = _setting(
        "demonstration episodes for the supervised warm start (0: none)", 512, INT, NON_NEGATIVE
    )
    warm_start_steps: int = _setting(
        "supervised warm-start steps (0: start RL from the model as loaded)", 200, INT, NON_NEGATIVE
    )
    warm_start_lr: float = _setting("warm-start learning rate", 2e-3, NUMBER, POSITIVE)
    warm_start_batch_size: int = _setting("warm-start batch size (episodes)", 16, INT, AT_LEAST_ONE)
    warm_start_average_decay: float = _setting(
        "end the warm start on an exponential moving average of its weights "
        "with this decay per step, e.g. 0.98 (0: the last step's weights)",
        0.0,
        NUMBER,
        BELOW_ONE,
        why=" (0: no averaging)",
    )
    warm_start_lr_schedule: str = _setting(
        "warm-start learning rate over the steps: 'constant' or 'cosine' (from --warm-start-lr down towards 0)",
        "constant",
        CHOICE,
        options=LR_SCHEDULES,
    )
    warm_start_max_turns: int = _setting(
        "turns a demonstration episode may run, at most the config's max_turns "
        "(0: max_turns); fewer keeps the demonstrations short when RL gets more "
        "turns than the warm start should show",
        0,
        INT,
        NON_NEGATIVE,
    )
    warm_start_group_by_length: bool = _setting(
        "batch warm-start demonstrations of similar length together: less "
        "padding, up to half the time per step; judge it by validation "
        "success",
        False,
        BOOL,
    )
    warm_start_micro_batch_size: int = _setting(
        "rows per forward and backward pass of a warm-start step, their "
        "gradients summed into the step's: the same step in less memory "
        "(0: the whole batch in one pass)",
        0,
        INT,
        NON_NEGATIVE,
    )
    warm_start_activation_checkpointing: bool = _setting(
        "keep only each layer's input in a warm-start step and run the layer again in its backward pass: the same "
        "weights to the bit in less memory, for longer steps (figures: the Benchmarks page)",
        False,
        BOOL,
    )
    warm_start_lora_rank: int = _setting(
        "train rank-r LoRA adapters on every linear layer in the warm start and fold "
        "them into the weights at its end: no gradients or AdamW moments for the "
        "frozen weights (SmolLM2: 1.6 GB less); needs peft (0: train every weight)",
        0,
        INT,
        NON_NEGATIVE,
    )
    warm_start_freeze_embeddings: bool = _setting(
        "keep the token embeddings and the LM head fixed in the warm start (tied in SmolLM2: 28M of 135M weights): "
        "no gradients or AdamW moments for them, about 0.5 GiB less at a SmolLM2 step's peak (the Benchmarks page)",
        False,
        BOOL,
    )
    warm_start_precision: str = _setting(
        "the warm start's forward pass: 'float32', or 'bfloat16' autocast "
        "(weights, optimizer and loss stay float32; faster on a CPU that computes "
        "bfloat16 natively and on GPUs, slower where it is emulated: the Benchmarks "
        "page)",
        "float32",
        CHOICE,
        options=WARM_START_PRECISIONS,
    )
    warm_start_device: str = _setting(
        "where the warm start trains: 'learner' (the learner's device: its GPU with "
        "--num-gpus-per-learner 1 when this process sees one, else the CPU), 'cpu', "
        "or 'cuda' / 'cuda:N'",
        "learner",
        OTHER,
        check=_warm_start_device_error,
        check_is_kind=True,
    )
    warm_start_eval_interval: int = _setting(
        "every N warm-start steps and after the last, play the validation "
        "states greedily (last weights, and averaged ones with averaging) and "
        "write warm_start_curve.csv: see how long the warm start should run "
        "(0: off)",
        0,
        INT,
        NON_NEGATIVE,
    )
    max_minutes: float = _setting(
        "end each trial early once one more iteration would run past this many minutes "
        "of its training time (Tune's time_total_s: iterations and validations; not the "
        "warm start or model loading), validated and exported as after its last "
        "iteration (0: no limit; --iterations still caps it)",
        0.0,
        NUMBER,
        NON_NEGATIVE,
    )
    pass_bar: float = _setting(
        "least rise of validation success over the warm start that counts as learning", 0.05, NUMBER
    )
    checkpoint_interval: int = _setting(
        "checkpoint each trial (Tune's checkpoint_<n>/ in its folder) every N iterations and after the last (0: never)",
        5,
        INT,
        NON_NEGATIVE,
    )
    run_name: str = _setting(
        "the run's folder inside output_dir (empty: <timestamp>_seed<seed>); with --resume, "
        "the run to continue (empty: the one output_dir/latest points at)",
        "",
        OTHER,
        check=_run_name_error,
        check_is_kind=True,
    )
    resume: bool = _setting(
        "continue a run's unfinished trials from their last checkpoints (Tune's "
        "Tuner.restore), iterations after that checkpoint are trained again",
        False,
        BOOL,
    )
    verbose: bool = _setting(
        "show library notices (RLlib, Ray, transformers) and loading bars on the console; "
        "otherwise they go to the run folder's job.log",
        False,
        BOOL,
    )
    sentinel: str = _setting(
        "the built-in echo-trap rules (rllib_ragen.sentinel.echo_trap_rules) and what they do "
        "when they fire: 'warn', 'stop', 'rollback' (restore the last healthy weights, halve "
        "the learning rates) or 'off'; --sentinel-rules (JSON) replaces them",
        "warn",
        CHOICE,
        options=SENTINEL_CHOICES,
    )
    timed_command: str = _setting(
        "the job's command in rllib_ragen.jobs.job_times.JOB_TIMES, whose measured wall "
        "time the plan line states for this kind of CPU ('': none); --preset and --quick "
        "add themselves to it",
        "",
        OTHER,
        check=_timed_command_error,
    )
    quick: bool = _setting(
        "a trial run, to see the job work end to end: 3 iterations, validation on at most 32 "
        "states, before and after only, a warm start of at most 60 steps on 256 demonstrations (a "
        "full run trains the job's own). Its numbers say nothing about learning. Flags given "
        "beside it still win",
        False,
        BOOL,
    )

    def validate(self, config=None) -> None:
        """Raise ValueError naming each field of the wrong kind or out of range, and each setting that does not fit
        ``config`` (the job's ``StarPOConfig``), the machine or the disk."""
        errors = [
            error
            for row in job_setting_rows()
            if (error := row.kind_error(getattr(self, row.name)) or row.value_error(getattr(self, row.name)))
            is not None
        ]
        device = self.warm_start_device
        if (
            isinstance(device, str)
            and not _warm_start_device_error(device)
            and device.startswith("cuda")
            and int(device.partition(":")[2] or 0) >= cuda_devices_seen()
        ):
            errors.append(
                f"warm_start_device={device!r}, but torch sees {cuda_devices_seen()} CUDA "
                "device(s) in this process (the warm start runs here): choose 'cpu', 'learner' or one "
                "it sees."
            )
        if config is not None and config.model_load_error():  # the driver loads the model (the warm start)
            errors.append(config.model_load_error())
        if config is not None and config.separate_policies:
            errors.append(
                f"multi_agent(policies={config.policy_ids()}): a main job reads back one policy (its report, "
                "evaluate and the self-play job's matches read <trial>/policy); train separate policies with StarPO "
                "itself (docs/multi-agent.md)."
            )
        turns = self.warm_start_max_turns
        if config is not None and is_int(turns) and turns > config.max_turns:
            errors.append(
                f"warm_start_max_turns={turns} exceeds max_turns={config.max_turns}: demonstrations would "
                "show turns the agent never plays. Lower it, or raise --max-turns."
            )
        if is_int(self.warm_start_lora_rank) and self.warm_start_lora_rank > 0 and not peft_installed():
            errors.append(
                f"warm_start_lora_rank={self.warm_start_lora_rank} trains LoRA adapters, which needs peft: "
                f"pip install 'rllib_ragen[lora]', or --warm-start-lora-rank 0 to train every weight."
            )
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
                return [
                    f"resume=True: there is no Tune experiment to continue at {self.run_folder()}. Give the "
                    "--output-dir of the job (its 'latest' run), or --run-name of the run."
                ]
            return _experiment_state_errors(self.run_folder())
        elif self.run_name and (base / self.run_name).exists():
            return [
                f"run_name={self.run_name!r}: {base / self.run_name} holds an earlier run (or a file). Continue "
                "it with --resume, or choose another --run-name. Nothing was overwritten."
            ]
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
    return [
        Knob(f.name, "warm start" if f.name.startswith("warm_start") else "job", f.default, **f.metadata["row"])
        for f in dataclasses.fields(JobSettings)
    ]


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


def _grid_errors(grid, config) -> list[str]:
    """What is wrong with a job's ``grid``: its shape, and each point as its trial would build it (a bad one fails
    now, not mid-sweep)."""
    shapes_ok = isinstance(grid, dict) and all(
        isinstance(k, str)
        and v
        and (
            isinstance(v, dict) and all(isinstance(s, dict) for s in v.values())
            if k == VARIANT_LABEL
            else isinstance(v, list)
        )
        for k, v in grid.items()
    )
    if not shapes_ok:
        return [
            f'grid={grid!r} must map config fields to non-empty lists of values, e.g. {{"lr": [1e-4, 3e-4]}}, '
            f'or "{VARIANT_LABEL}" to named settings, e.g. {{"{VARIANT_LABEL}": {{"small": {{"lr": 1e-4}}, '
            '"large": {"lr": 3e-4}}}.'
        ]
    variants = grid.get(VARIANT_LABEL, {})
    varied = set(grid) - {VARIANT_LABEL} | {field for settings in variants.values() for field in settings}
    if "seed" in varied:  # the seeds make trials of their own, and name each trial's folder
        seeds = ",".join(str(seed) for seed in grid.get("seed", [0, 1, 2]))
        return [
            f"grid varies 'seed': give the seeds as seeds (--seeds {seeds}), which runs one trial per seed for "
            "every point of the grid."
        ]
    if PRESET_LABEL in grid and VARIANT_LABEL in grid:
        return [
            f"grid has both '{PRESET_LABEL}' and '{VARIANT_LABEL}': give each preset's settings as a variant "
            "instead (StarPOConfig().preset(name).to_dict() lists them)."
        ]
    twice = sorted(set(grid) & {field for settings in variants.values() for field in settings})
    if twice:
        return [
            f"grid varies {twice} both as a list and in its variants: one would overwrite the other; set them "
            "in the variants only."
        ]
    if config is None:
        return []
    unknown = sorted(varied - set(config.to_dict()) - {PRESET_LABEL})
    if unknown:
        return [
            f"grid names {unknown}, which are not fields of the config; use the names of StarPOConfig's fields "
            f"(e.g. lr, rollout_filter_ratio), '{PRESET_LABEL}' or '{VARIANT_LABEL}'."
        ]
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
