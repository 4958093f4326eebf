"""Saved policies played on fixed validation states: ``python -m rllib_ragen.jobs.evaluate POLICY [POLICY ...]``.

A policy is a folder ``transformers`` loads: a job's exported ``policy/``, a warm start, any checkpoint of the same
model. Each is played on the same states, greedily and sampled, the way the job's validation plays them (its
prompts, turn and token budgets, transition seeds, validation temperature and sampling seed), so evaluating a run's
``policy/`` with the run's own settings gives back its ``summary.json`` figures "after RL". Each later policy is
paired against the first, as a job pairs "after RL" against "before" (the interval and exact McNemar p of
:mod:`~rllib_ragen.jobs.paired_stats`): give the warm start first, ``evaluate WARM_START RUN/seed0/policy``. Each
policy's greedy play is also paired against the run's scripted baselines where they played the same states.

The settings come from the trial folder of the first policy that sits in one (``RUN/seed0/policy`` -> ``RUN/seed0``:
Tune's ``params.json``, never a pickle) or from ``--run``; ``--env``, ``--env-config``, ``--states`` and
``--seed-start`` choose other states. ``--output FILE`` writes the figures as JSON. Library notices (transformers'
loading bars and warnings) stay off the console and go to ``--log FILE`` (default: beside ``--output``, else a new file
in the temporary folder), named at the end when there were any.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import pathlib
import sys
import tempfile
import time

from ..progress import Progress
from .outputs import BASELINES, json_ready
from .console import close_run_log, keep_notices_off_the_console, send_notices_to
from .readers import baseline_name, read_outcomes, state_of, trajectory_outcomes
from ..files import write_text_atomically
from .paired_stats import PairedComparison, paired_comparison
from .readers import RunFolderImportError, trial_config

__all__ = ["evaluate", "evaluation_config", "main"]

MODES = ("greedy", "sampled")


def evaluation_config(
    run: pathlib.Path,
    env: str | None = None,
    env_config: dict | None = None,
    states: int | None = None,
    seed_start: int | None = None,
    allow_imports: bool = False,
):
    """The trial ``run``'s config (its ``params.json``), validating on ``env`` (with ``env_config``) instead of its
    own validation environments where given, ``states`` states from ``seed_start``. ``allow_imports``: import the
    modules the run's settings name (``readers.trial_config``); else such a setting is refused."""
    config = trial_config(run, allow_imports)
    if env is not None or env_config is not None:
        config.environment(
            env or config.env,
            env_config=env_config if env_config is not None else config.env_config,
            train_envs=None,
            validation_envs=None,
            curriculum=None,
        )
    elif states is not None and config.validation_envs:  # each of several validation environments gets ``states``
        config.environment(validation_envs=[{**entry, "states": states} for entry in config.validation_envs])
    config.training(
        **{k: v for k, v in (("validation_size", states), ("validation_seed_start", seed_start)) if v is not None}
    )
    config.validate()
    return config


def evaluate(
    policies: list[str],
    config,
    modes=MODES,
    baselines_dir: pathlib.Path | None = None,
    device: str = "cpu",
    show_progress: bool = False,
) -> dict:
    """Play every policy on ``config``'s validation states in each mode, on ``device``; per validation environment,
    pair each later policy against the first, and each policy's greedy play against every baseline of
    ``baselines_dir`` that played states of it. Returns the figures and each state's outcome (``"<env>:<seed>"``
    keys). ``show_progress``: a bar (a line every few seconds off a terminal) for each policy and mode."""
    from ..starpo import StarPO

    temperatures = {"greedy": 0.0, "sampled": config.validation_temperature}
    episodes = len(config.validation_starts()) * config.validation_group_size
    outcomes = {}
    for number, (policy, mode) in enumerate(itertools.product(policies, modes), start=1):
        where = f"[{number}/{len(policies) * len(modes)}] {policy}, {mode} (T={temperatures[mode]:g})"
        shown = Progress(episodes, where, "episodes") if show_progress else None
        played = trajectory_outcomes(
            StarPO.play_validation_states_with(
                config,
                str(policy),
                temperature=temperatures[mode],
                device=device,
                progress=shown and (lambda done, _: shown.update(done)),
            )
        )
        outcomes.setdefault(policy, {})[mode] = played
        if shown:
            shown.close()
            print(f"{where}: success {_mean(played):.3f}", flush=True)
    first = policies[0]
    envs = [e.name for e in config.validation_environments()]
    result = {"temperatures": {m: temperatures[m] for m in modes}, "environments": {}}
    for env in envs:
        played = {p: {m: _of_env(o, env) for m, o in by_mode.items()} for p, by_mode in outcomes.items()}
        entry = {
            "states": len(played[first][modes[0]]),
            "success": {p: {m: _mean(o) for m, o in by_mode.items()} for p, by_mode in played.items()},
            "paired": {
                p: {m: paired_comparison(played[first][m], played[p][m]).as_dict() for m in modes} for p in policies[1:]
            },
            "baselines": {},
        }
        for file in sorted(baselines_dir.glob("*.parquet")) if baselines_dir and baselines_dir.is_dir() else []:
            baseline = _of_env(read_outcomes(file), env)
            if not baseline:
                continue
            greedy = {p: by_mode.get("greedy") for p, by_mode in played.items()}
            same = all(g is not None and set(baseline) <= set(g) for g in greedy.values())  # all its states played
            entry["baselines"][baseline_name(file)] = {
                "success": _mean(baseline),
                "states": len(baseline),
                "paired_greedy": {
                    p: paired_comparison(baseline, {k: g[k] for k in baseline}).as_dict() for p, g in greedy.items()
                }
                if same
                else None,
            }
        result["environments"][env] = entry
    result["outcomes"] = outcomes
    return result


def _device_error(device: str) -> str | None:
    """Why torch cannot play on ``device`` in this process, or None."""
    import torch

    try:
        kind = torch.device(device)
    except (RuntimeError, ValueError):
        return "not a torch device; choose 'cpu', 'cuda' or 'cuda:N'"
    if kind.type not in ("cpu", "cuda"):
        return "choose 'cpu', 'cuda' or 'cuda:N'"
    if kind.type == "cuda" and (kind.index or 0) >= torch.cuda.device_count():
        return f"this process sees {torch.cuda.device_count()} CUDA device(s); choose 'cpu' or one it sees"
    return None


def _weights_error(policy: str) -> str | None:
    """Why a policy folder's weights cannot be read, found from each safetensors file's header (cheap: no tensor is
    read), so that a cut file is named before minutes of play, not after the first policy's; None if they can."""
    from safetensors import safe_open

    for file in sorted(pathlib.Path(policy).glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt"):
                pass
        except Exception as error:  # safetensors' own error type (SafetensorError), or the OS's
            return f"{file} cannot be read ({type(error).__name__}: {error}); was it cut short?"
    return None


def one_line(error: Exception) -> str:
    """A validation error as one line: its header and each reason, joined."""
    head, *reasons = [line.strip().removeprefix("- ") for line in str(error).strip().splitlines() if line.strip()]
    return f"{head} {'; '.join(reasons)}" if reasons else head


def _of_env(outcomes: dict[str, float], env: str) -> dict[str, float]:
    return {key: value for key, value in outcomes.items() if state_of(key)[0] == env}


def _mean(outcomes: dict[str, float]) -> float:
    return sum(outcomes.values()) / len(outcomes)


def print_evaluation(result: dict, policies: list[str]) -> None:
    modes = list(result["temperatures"])
    heads = [f"{m} (T={result['temperatures'][m]:g})" for m in modes]
    width = max(len(p) for p in policies)
    for env, entry in result["environments"].items():
        print(f"\n{env}: success on {entry['states']} validation states\n{'policy':{width}s}  " + "  ".join(heads))
        for policy in policies:
            print(
                f"{policy:{width}s}  "
                + "  ".join(f"{entry['success'][policy][m]:<{len(h)}.3f}" for m, h in zip(modes, heads))
            )
        for policy, by_mode in entry["paired"].items():
            print(f"{policy} against {policies[0]}, paired on the same states:")
            for mode, pair in by_mode.items():
                print(f"  {mode:8s}{PairedComparison(**pair).describe()}")
        for name, baseline in entry["baselines"].items():
            print(
                f"baseline {name}: {baseline['success']:.3f} on its {baseline['states']} states"
                + ("; not paired: it played states these are not" if baseline["paired_greedy"] is None else "")
            )
            for policy, pair in (baseline["paired_greedy"] or {}).items():
                print(f"  {policy}, greedy, against it: {PairedComparison(**pair).describe()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rllib_ragen.jobs.evaluate", description=__doc__.split("\n\n")[1].replace("\n", " ")
    )
    parser.add_argument(
        "policies",
        nargs="+",
        metavar="POLICY",
        help="policy folders; every policy after the first is paired against the first, as "
        "after RL against before: the warm start first",
    )
    parser.add_argument(
        "--run",
        type=pathlib.Path,
        default=None,
        help="the trial folder whose settings to play with (default: that of the first policy that sits in one)",
    )
    parser.add_argument("--env", default=None, help="validate on this environment id instead of the run's")
    parser.add_argument("--env-config", type=json.loads, default=None, help="its arguments, as a JSON object")
    parser.add_argument("--states", type=int, default=None, help="how many states (default: the run's)")
    parser.add_argument(
        "--seed-start", type=int, default=None, help="the first state's reset seed (default: the run's)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="greedy, sampled or both (default: both)")
    parser.add_argument("--output", type=pathlib.Path, default=None, help="write the figures to this JSON file")
    parser.add_argument(
        "--log",
        type=pathlib.Path,
        default=None,
        help="append library notices (model loading, warnings) to this file (default: OUTPUT.log "
        "beside --output, else a new file in the temporary folder, named at the end)",
    )
    parser.add_argument(
        "--register",
        default=None,
        metavar="MODULE",
        help="import this module first (one that calls register_text_env for the run's environment)",
    )
    parser.add_argument(
        "--allow-run-imports",
        action="store_true",
        help="import the modules the run's settings name (a TRL environment's import path): that "
        "runs their code, so only for a run you trust",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the policies play: 'cpu' (default) or 'cuda' / 'cuda:N'; a run sampled on a GPU "
        "is reproduced there (float kernels round differently on each)",
    )
    args = parser.parse_args(argv)
    keep_notices_off_the_console()  # transformers' loading bars and library notices; errors still print
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes {args.modes!r}: choose from {', '.join(MODES)}")
    if args.env_config is not None and not isinstance(args.env_config, dict):
        parser.error(f"--env-config must be a JSON object, not {args.env_config!r}")
    if args.states is not None and args.states < 1:
        parser.error(f"--states {args.states}: give a positive number of validation states")
    device_error = _device_error(args.device)
    if device_error:
        parser.error(f"--device {args.device!r}: {device_error}")
    missing = [p for p in args.policies if not (pathlib.Path(p) / "config.json").is_file()]
    if missing:
        parser.error(
            f"{missing[0]} holds no config.json: a policy is a folder saved with save_pretrained (a job's "
            "RUN/seed0/policy)"
        )
    unreadable = next(filter(None, map(_weights_error, args.policies)), None)
    if unreadable:
        parser.error(unreadable)
    run = args.run or next(
        (
            folder
            for folder in (pathlib.Path(p).resolve().parent for p in args.policies)
            if (folder / "params.json").is_file()
        ),
        None,
    )
    if run is None:
        parser.error(
            "no policy sits in a trial folder (a job's RUN/seed0/policy), whose params.json holds the "
            "settings to play with: give that folder with --run"
        )
    if not (run / "params.json").is_file():
        parser.error(
            f"{run} holds no params.json, the settings to play with: give the trial folder with --run "
            "(a job's RUN/seed0)"
        )
    if args.register:
        importlib.import_module(args.register)
    try:
        config = evaluation_config(
            run, args.env, args.env_config, args.states, args.seed_start, allow_imports=args.allow_run_imports
        )
    except RunFolderImportError as error:  # names params.json itself
        parser.error(str(error))
    except ValueError as error:
        parser.error(f"{run / 'params.json'}: {one_line(error)}")
    experiment_baselines = run.parent / BASELINES
    log = args.log or (
        args.output.with_name(args.output.name + ".log")
        if args.output
        else pathlib.Path(tempfile.gettempdir())
        / f"rllib_ragen_evaluate_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}.log"
    )
    send_notices_to(log)  # never into the run folder: a reader does not write there
    try:
        result = evaluate(args.policies, config, modes, experiment_baselines, device=args.device, show_progress=True)
    except OSError as error:  # a policy folder that does not load (load_policy names the folder and the cause)
        _name_the_log(log, given=args.log is not None)
        parser.error(one_line(error))
    print_evaluation(result, args.policies)
    if args.output:
        write_text_atomically(args.output, json.dumps(json_ready(result), indent=2, allow_nan=False))
        print(f"\nwrote {args.output}")
    _name_the_log(log, given=args.log is not None)
    return 0


def _name_the_log(log: pathlib.Path, given: bool) -> None:
    """Close the notices' log and say where they went; a log file the user did not name (--log) that stayed empty is
    removed, not left behind."""
    close_run_log()
    if log.is_file() and log.stat().st_size:
        print(f"library notices (model loading, warnings): {log}", flush=True)
    elif log.is_file() and not given:
        log.unlink()


if __name__ == "__main__":
    sys.exit(main())
