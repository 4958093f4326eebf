"""The main-job driver behind ``tuned_examples/``: warm start, StarPO training with progress, and outputs.

Plain calls, no trainer framework. A job file defines its ``StarPOConfig`` and its :class:`JobSettings` (output
folder, iterations, warm start, pass bar); :func:`parse_job_args` lays the command-line flags over both; then
:func:`run_job` warm-starts the policy on demonstrations, builds the algorithm, trains it while printing progress,
and writes what a user needs to judge the run.

Each run writes to its own folder, ``<output_dir>/<timestamp>_seed<seed>/`` with ``<output_dir>/latest`` pointing
at the newest (see ``experiment_outputs``): ``run_config.json``, ``metrics.csv`` (one row per iteration, every
scalar result, named by its path in the result: ``env_runners/...``, ``learners/default_policy/...``),
``tensorboard/``, ``learning_curve.png``, ``validation_rollouts.parquet`` (the last validation's episodes, with their
text), ``policy/`` (the trained model, loadable by plain transformers), ``summary.json`` (before/after validation
metrics, throughput, wall time), ``job.log``, ``sentinel.json`` (the sentinel's firings),
``training_rollouts.parquet`` (a training sample at every probe iteration, with token advantages), ``rollouts.html``
(the rollout viewer), ``warm_start/`` (the SFT model), ``warm_start_curve.csv`` (greedy held-out success during
the warm start, with ``warm_start_eval_interval``) and ``checkpoint/`` (the algorithm every
``checkpoint_interval`` iterations and after the last; ``resume`` continues from it).

Example::

    config = StarPOConfig().environment("rllib_ragen/Bandit-v0").training(validation_interval=10)
    config, job = parse_job_args(config, JobSettings(output_dir="outputs/bandit", iterations=10))
    run_job(config, job, demonstration_policy=random_arm_policy(seed=0))
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import statistics
import sys
import time
from typing import TYPE_CHECKING, Callable

import torch

from . import metrics as M
from .collapse import reasoning_entropy
from .experiment_flags import JobSettings, parse_job_args, user_model_config
from .experiment_outputs import (AFTER_GREEDY_ROLLOUTS, AFTER_ROLLOUTS, BASELINES, BEFORE_GREEDY_ROLLOUTS,
                                 BEFORE_ROLLOUTS, CHECKPOINT, JOB_WALL_TIME, LATEST, LEARNER, SENTINEL_FILE, SMOOTHING,
                                 TRAINING, TRAINING_ROLLOUTS, VALIDATED_AT, VALIDATION, WARM_START_CURVE,
                                 TensorBoardLog, baseline_file, check_output_paths, check_resume, close_run_log,
                                 json_ready, keep_notices_off_the_console, keep_rollouts_up_to, plot_learning_curve,
                                 read_csv, read_first_reasonings, read_outcomes, read_reasoning_claims,
                                 resolve_run_folder, send_notices_to, start_run_folder, state_of, trailing_mean,
                                 write_csv, write_rollouts, write_text_atomically)
from .held_out import initial_states
from .paired_stats import PairedComparison, paired_by_subset, paired_comparison
from .sentinel import as_rule, echo_trap_rules
from .sft import DEMONSTRATION_SEED_START
from .viewer import write_viewer

if TYPE_CHECKING:
    from .starpo.config import EnvEntry

__all__ = ["JobSettings", "demonstration_rollout_config", "flatten_result", "parse_job_args", "run_job",
           "warm_start"]

SUMMARY_METRICS = (M.SUCCESS, "pass@1", M.VALID_ACTION_RATE, M.FORMAT_ERROR_RATE, M.RETURN_MEAN, M.NUM_ACTIONS)


def demonstration_rollout_config(config, job: JobSettings):
    """The agent loop the demonstrations are played in: the config's, cut to ``job.warm_start_max_turns`` turns when
    that is set. The prompts do not state the turn budget, so a cut demonstration is the first turns of a whole one."""
    rollout_config = config.rollout_config()
    if job.warm_start_max_turns:
        rollout_config = dataclasses.replace(rollout_config, max_turns=job.warm_start_max_turns)
    return rollout_config


def warm_start(config, job: JobSettings, policy: Callable[[str], str], path: pathlib.Path) -> str:
    """Fine-tune the config's model on ``policy``'s demonstrations; save it to ``path`` and return that path."""
    from .rollout.models import load_policy
    from .sft import collect_demonstrations, supervised_warm_start

    t0 = time.perf_counter()
    sft_log = logging.getLogger("rllib_ragen.sft")  # its every-50-steps loss lines are this job's progress
    if not sft_log.handlers:
        sft_log.addHandler(logging.StreamHandler(sys.stdout))
        sft_log.setLevel(logging.INFO)
    seed = config.seed or 0
    model, tokenizer = load_policy(config.model_config["model"], seed=seed)
    if torch.cuda.is_available():  # the same steps on the GPU, many times faster
        model.to(config.local_gpu_idx)
    demos = collect_demonstrations(demonstration_rollout_config(config, job), policy, tokenizer,
                                   job.warm_start_episodes)
    longest = max(end - start for t in demos for start, end in t.turn_spans)
    if longest > config.max_new_tokens_per_turn:  # RL would cut such replies short: a format error every time
        raise ValueError(f"A demonstrated reply takes {longest} tokens, more than max_new_tokens_per_turn="
                         f"{config.max_new_tokens_per_turn} lets the policy write; raise it to at least {longest} "
                         f"(--max-new-tokens-per-turn {longest}) or demonstrate shorter replies.")
    curve = (held_out_greedy_curve(config, model, tokenizer, path.parent / WARM_START_CURVE)
             if job.warm_start_eval_interval else None)
    losses = supervised_warm_start(model, demos, steps=job.warm_start_steps, batch_size=job.warm_start_batch_size,
                                   lr=job.warm_start_lr, seed=seed, pad_token_id=tokenizer.pad_token_id,
                                   average_decay=job.warm_start_average_decay,
                                   lr_schedule=job.warm_start_lr_schedule,
                                   group_by_length=job.warm_start_group_by_length,
                                   precision=job.warm_start_precision,
                                   evaluate=curve, evaluate_every=job.warm_start_eval_interval)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    # Which states the model was shown, so that a run started later from this folder (--model) still counts them
    # as seen in its held-out report.
    write_text_atomically(path / DEMONSTRATIONS_FILE, json.dumps(
        {"env": config.env_name, "seeds": [DEMONSTRATION_SEED_START, DEMONSTRATION_SEED_START + len(demos)]}))
    print(f"warm start: {len(demos)} demonstrations ({sum(t.success for t in demos) / len(demos):.0%} successful), "
          f"{job.warm_start_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return str(path)


def held_out_greedy_curve(config, model, tokenizer, path: pathlib.Path) -> Callable[[int, str], None]:
    """An ``evaluate`` for ``supervised_warm_start``: each call plays the config's validation states greedily with
    ``model`` as it is, adds a row (step, weights, greedy success pooled and per environment, format errors) to the
    CSV at ``path``, rewritten whole each time so that a stopped run keeps its points, and prints it."""
    from .rollout.engine import RolloutEngine, rollout_metrics
    from .starpo.inference_engines import make_backend

    starts, rollout_config = config.validation_starts(), config.rollout_config()
    # As StarPO.play_validation_states(0.0) plays them after the warm start: the validation's settings, greedy.
    greedy = dataclasses.replace(config.sampling_params(validation=True), temperature=0.0)
    rows: list[dict] = []

    def evaluate(step: int, weights: str) -> None:
        t0 = time.perf_counter()
        # A fresh backend each time: the weights changed in place, so an earlier call's KV cache is stale.
        backend = make_backend("hf", model, tokenizer, config)
        trajectories, _ = RolloutEngine(rollout_config, backend, tokenizer).rollout(starts, 1, greedy, sample_seed=0)
        metrics = rollout_metrics(trajectories, 1)
        row = {"step": step, "weights": weights, M.SUCCESS: metrics[M.env_metric(M.POOLED, M.SUCCESS)],
               M.FORMAT_ERROR_RATE: metrics[M.env_metric(M.POOLED, M.FORMAT_ERROR_RATE)]}
        if config.is_mixture:
            row.update({M.env_metric(e.name, M.SUCCESS): metrics.get(M.env_metric(e.name, M.SUCCESS), math.nan)
                        for e in config.validation_environments()})
        rows.append(row)
        write_csv(path, rows)
        print(f"warm start step {step}: greedy success {row[M.SUCCESS]:.3f} on {len(starts)} held-out states "
              f"({weights} weights; format errors {row[M.FORMAT_ERROR_RATE]:.2f} of turns; "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)

    return evaluate


def run_job(config, job: JobSettings, demonstration_policy: Callable[[str], str] | None = None,
            reference_lines: dict[str, float] | None = None,
            baselines: dict[str, Callable[[str], str]] | None = None) -> dict:
    """Warm start (when a demonstration policy is given), train, and write the outputs. Returns the summary.

    The run gets its own folder (``experiment_outputs``); its path is printed first and stored in the summary
    (``run_dir``). Validation runs before training and every ``validation_interval`` iterations, as the config
    says, and once more after the last iteration when that one did not validate, so "after" is always the trained
    policy. The verdict against ``job.pass_bar`` (the least rise of validation success over the warm start that
    counts as learning) is printed and stored in the summary (``success_gain``, ``passed``).
    ``reference_lines`` (e.g. ``{"random policy": 0.22, "optimal policy": 1.0}``) are drawn on the success panel.
    ``baselines`` (name: a scripted policy, prompt text -> reply, e.g. ``frozen_lake_hole_blind_policy()``) are
    played on the headline environment's validation states (``headline_environment``) before RL, and the greedy
    agent is paired against each before and after RL: which states it solves that the baseline fails, and the
    reverse (``summary.json``'s ``baselines``; their episodes under ``baselines/`` in the run folder). The final
    table and ``summary.json`` score the headline environment: the first validation environment that is the first
    training environment, else the first validation environment.
    """
    job.validate(config)
    files = [baseline_file(name) for name in baselines or {}]  # before any work: each baseline needs its own file
    if len(set(files)) < len(files):
        raise ValueError(f"baselines {sorted(baselines)} would share a file ({files}): give them names that differ "
                         "in their letters or digits.")
    if set(baselines or {}) & set(reference_lines or {}):  # the curve draws both by name: one would hide the other
        raise ValueError(f"{sorted(set(baselines) & set(reference_lines))} names both a baseline and a reference "
                         "line; rename one.")
    if not job.verbose:
        keep_notices_off_the_console()
    if not config.sentinel_rules and job.sentinel != "off":  # custom rules (--sentinel-rules) replace the built-in
        config = config.copy(copy_frozen=False).training(sentinel_rules=echo_trap_rules(job.sentinel))
    out = resolve_run_folder(job.output_dir, job.run_name, job.resume, config.seed or 0)
    check_output_paths(out)  # before any work: a run must not train for minutes and then fail to save
    check_resume(out / CHECKPOINT, job.resume)
    start_run_folder(out, config, job)
    try:
        return _run(config, job, demonstration_policy, out, reference_lines or {}, baselines or {})
    finally:
        close_run_log()


def _run(config, job: JobSettings, demonstration_policy, out: pathlib.Path, reference_lines: dict,
         baselines: dict) -> dict:
    import ray

    if not job.verbose:
        send_notices_to(out / "job.log")
    torch.set_num_threads(job.threads)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False,
                 **({} if job.verbose else {"logging_level": logging.ERROR}))
        if not job.verbose:
            keep_notices_off_the_console()  # ray.init set up its console handler again
    t_start, earlier_s = time.perf_counter(), 0.0
    _print_plan(config, job, out, demonstration_policy is not None)

    base_model = config.model_config["model"]
    warm_started = demonstration_policy is not None and job.warm_start_steps > 0 and job.warm_start_episodes > 0
    if warm_started:
        warm_dir = out / "warm_start"
        if job.resume and (warm_dir / "config.json").is_file():
            model = str(warm_dir)  # the checkpoint was trained from it; fine-tuning again would only cost time
            print(f"warm start: reusing {warm_dir}", flush=True)
        else:
            model = warm_start(config, job, demonstration_policy, warm_dir)
        config = config.copy(copy_frozen=False).rl_module(model_config={**user_model_config(config), "model": model})
    # The "before" validation runs here, not inside the first train(): its score is printed as soon as it is known
    # and its one-off cost stays out of the iteration times. Same seeds and sampling seed, so the same numbers.
    # Whatever validation_interval says (0: no validation between iterations), the job measures after RL; it
    # measures before RL too unless validate_before_training is off, and then has no gain to report.
    validate_first = bool(not job.resume and config.validate_before_training)
    if validate_first:
        config = config.copy(copy_frozen=False).training(validate_before_training=False)
    headline = headline_environment(config)  # what the table, curves and viewer score
    algo = config.build_algo()
    rows: list[dict] = []
    validations: list[dict] = []
    clock = _Clock(job.iterations, config.validation_interval)
    tensorboard = TensorBoardLog(out / "tensorboard")
    try:
        # Played first (seconds), so that a baseline that cannot play these states fails before any RL.
        if baselines:
            (out / BASELINES).mkdir(exist_ok=True)
        for name, policy in baselines.items():
            write_rollouts(out / baseline_file(name), play_baseline(config, policy, algo.tokenizer), algo.tokenizer)
        if job.resume:
            algo.restore_from_path(out / CHECKPOINT)
            rows = read_csv(out / "metrics.csv", up_to=algo.iteration)
            keep_rollouts_up_to(out / TRAINING_ROLLOUTS, algo.iteration)  # later ones are played again
            for row in rows:
                _keep_validation(row, validations)
            print(f"resumed from {out / CHECKPOINT} at iteration {algo.iteration} ({len(rows)} rows of metrics.csv "
                  "kept)", flush=True)
            earlier_s = rows[-1].get(JOB_WALL_TIME, 0.0) if rows else 0.0  # the sessions before this one
            if algo.iteration >= job.iterations:  # never silent: the run keeps the iterations it has
                print(f"the run is at iteration {algo.iteration}, and iterations is {job.iterations}: nothing left "
                      "to train (raise --iterations to train longer); validating and writing its outputs again",
                      flush=True)
        elif validate_first:
            t0 = time.perf_counter()
            before = flatten_result({"evaluation": {"env_runners": algo.evaluate_validation_set()}})
            clock.validation_s = time.perf_counter() - t0
            _keep_validation(before, validations)
            tensorboard.write(before, 0)
            # kept for the paired comparison and the viewer
            write_rollouts(out / BEFORE_ROLLOUTS, algo.last_validation, algo.tokenizer)
            write_rollouts(out / BEFORE_GREEDY_ROLLOUTS, algo.play_validation_states(0.0), algo.tokenizer)
            print(f"before RL: validation success {_validation_summary(before, config)} ({clock.validation_s:.0f} s)",
                  flush=True)
        while algo.iteration < job.iterations:
            t0 = time.perf_counter()
            result = algo.train()
            row = flatten_result(result)
            row[JOB_WALL_TIME] = earlier_s + time.perf_counter() - t_start
            rows.append(row)
            _record_firings(algo, out)
            if algo.last_token_advantages:  # the probe ran: keep a sample of this rollout, with its advantages
                _keep_training_sample(algo, out / TRAINING_ROLLOUTS)
            validated = _keep_validation(row, validations)
            clock.record(time.perf_counter() - t0, validated)
            _print_progress(config.env_name, job.iterations, rows, clock)
            if validated:
                print(f"  validation at iteration {algo.iteration}: success "
                      f"{_validation_summary(validations[-1], config)} "
                      f"(before RL {_validation_summary(validations[0], config, counts=False)})", flush=True)
            write_csv(out / "metrics.csv", rows)
            # Rows between validations repeat the last validation's numbers: TensorBoard gets them once, at the
            # iteration they were measured.
            tensorboard.write(row if validated else {k: v for k, v in row.items() if not k.startswith(VALIDATION)},
                              algo.iteration)
            stopping = bool(result.get("done"))
            if job.checkpoint_interval and (algo.iteration % job.checkpoint_interval == 0
                                            or algo.iteration == job.iterations or stopping):
                algo.save_to_path(out / CHECKPOINT)
            if stopping:
                print(f"stopped at iteration {algo.iteration} of {job.iterations} by the sentinel (see above and "
                      f"{out / SENTINEL_FILE})", flush=True)
                break
        if (not algo.last_validation or not validations
                or validations[-1][VALIDATED_AT] != algo.iteration):
            after = flatten_result({"evaluation": {"env_runners": algo.evaluate_validation_set()}})
            _keep_validation(after, validations)
            tensorboard.write(after, algo.iteration)
        write_rollouts(out / AFTER_ROLLOUTS, algo.last_validation, algo.tokenizer, iteration=algo.iteration)
        write_rollouts(out / AFTER_GREEDY_ROLLOUTS, algo.play_validation_states(0.0), algo.tokenizer,
                       iteration=algo.iteration)
        algo.export_pretrained(out / "policy")
        write_viewer(out, validation_env=headline.name)
    finally:
        algo.stop()
        tensorboard.close()
    summary = _summary(config, base_model, rows, validations, earlier_s + time.perf_counter() - t_start)
    summary["success_gain"] = summary["after"][M.SUCCESS] - summary["before"][M.SUCCESS]
    summary["passed"] = bool(summary["success_gain"] >= job.pass_bar)
    scored = {headline.name} if config.is_mixture else None  # the table's environment; by_env has the others
    summary["paired"] = _paired(out, SAMPLED_AND_GREEDY["sampled"], scored)
    summary["paired_greedy"] = _paired(out, SAMPLED_AND_GREEDY["greedy"], scored)
    summary["reasoning_entropy"] = _reasoning_entropy(out, scored)
    summary["reasoning_grounded"] = _reasoning_grounded(out, scored)
    if baselines:
        summary["baselines"] = _against_baselines(config, out, baselines)
    if config.is_mixture:
        summary["by_env"] = {e.name: {mode: _paired(out, files, {e.name}) for mode, files in SAMPLED_AND_GREEDY.items()}
                             for e in config.validation_environments()}
    trained = trained_seeds_by_env(config, algo.seed_schedule.next_train)
    for env_name, seeds in demonstrated_seeds(config.model_config["model"]).items():
        trained.setdefault(env_name, []).extend(seeds)
    summary["held_out"] = _held_out(config, out, trained)
    summary["sentinel_firings"] = [dataclasses.asdict(f) for f in algo.sentinel.firings]
    summary["run_dir"] = str(out)
    # Standard JSON (NaN as null), and never half-written
    write_text_atomically(out / "summary.json", json.dumps(json_ready(summary), indent=2, allow_nan=False))
    title = (f"{config.env_name} | model {pathlib.Path(str(base_model)).name} | seed {config.seed} | "
             f"{summary['iterations']} iterations")
    baseline_lines = {name: b["success"] for name, b in summary.get("baselines", {}).items()}
    plot_learning_curve(out / "learning_curve.png", rows, validations, config.env_name, title,
                        {"warm start": summary["before"][M.SUCCESS], **reference_lines, **baseline_lines},
                        validation_env=headline.name)
    _print_table(summary, config)
    _print_paired(summary, config)
    if math.isfinite(summary["success_gain"]):
        print(f"success gain {summary['success_gain']:+.3f} (bar {job.pass_bar}): "
              f"{'PASS' if summary['passed'] else 'below the bar'}")
    else:
        print(f"success gain not measured: no validation before RL (validate_before_training=False), so the bar "
              f"({job.pass_bar}) is not judged")
    print(f"outputs: {out}")
    return summary


def _keep_training_sample(algo, path: pathlib.Path, unkept: int = 8) -> None:
    """Append this iteration's trained episodes (with their token advantages) and ``unkept`` of the episodes the
    rollout filter left out to the training sample the viewer shows."""
    advantages = algo.last_token_advantages
    left_out = [i for i in range(len(algo.last_rollout)) if i not in advantages][:unkept]
    chosen = sorted([*advantages, *left_out])
    write_rollouts(path, [algo.last_rollout[i] for i in chosen], algo.tokenizer, iteration=algo.iteration,
                   advantages={new: advantages[old] for new, old in enumerate(chosen) if old in advantages},
                   append=True)


def _record_firings(algo, out: pathlib.Path) -> None:
    """Keep the run's sentinel firings in ``sentinel.json`` (the algorithm logs each one as a warning)."""
    if algo.sentinel.rules:
        write_text_atomically(out / SENTINEL_FILE,
                              json.dumps([dataclasses.asdict(f) for f in algo.sentinel.firings], indent=2))


SAMPLED_AND_GREEDY = {"sampled": (BEFORE_ROLLOUTS, AFTER_ROLLOUTS),
                     "greedy": (BEFORE_GREEDY_ROLLOUTS, AFTER_GREEDY_ROLLOUTS)}


def _outcome_pair(out: pathlib.Path, files: tuple[str, str], envs: set[str] | None = None) -> tuple[dict, dict] | None:
    """Each held-out state's success before and after RL (``files``), of the environments named ``envs`` (None:
    all); None without both files, with different states, or with fewer than two."""
    if not all((out / name).is_file() for name in files):
        return None
    before, after = (read_outcomes(out / name) for name in files)
    if envs is not None:
        before, after = ({k: v for k, v in outcomes.items() if state_of(k)[0] in envs} for outcomes in (before, after))
    if before.keys() != after.keys() or len(before) < 2:
        return None  # e.g. a resumed run whose validation settings changed: not the same states
    return before, after


def _held_out_file_pairs(out: pathlib.Path):
    """(mode, before file, after file) for sampled and greedy, where the run wrote both files of the pair."""
    for mode, (before, after) in SAMPLED_AND_GREEDY.items():
        if (out / before).is_file() and (out / after).is_file():
            yield mode, out / before, out / after


def _reasoning_entropy(out: pathlib.Path, envs: set[str] | None) -> dict | None:
    """The entropy of the first turn's reasoning over the held-out episodes before and after RL, sampled and
    greedy (``collapse.reasoning_entropy``, nats); None where the replies carry no reasoning."""
    result = {}
    for mode, before_file, after_file in _held_out_file_pairs(out):
        before, after = (read_first_reasonings(path, envs) for path in (before_file, after_file))
        if before is not None and after is not None and (any(before) or any(after)):
            result[mode] = {"before": reasoning_entropy(before), "after": reasoning_entropy(after),
                            "episodes": len(after)}
    return result or None


def _reasoning_grounded(out: pathlib.Path, envs: set[str] | None) -> dict | None:
    """The share of the checkable claims about the state in the held-out episodes' reasoning that held, before
    and after RL, sampled and greedy (``TextEnv.reasoning_claims``); None where the environment checked none."""
    result = {}
    for mode, before_file, after_file in _held_out_file_pairs(out):
        (checked_before, true_before), (checked_after, true_after) = (
            read_reasoning_claims(path, envs) for path in (before_file, after_file))
        if checked_before and checked_after:
            result[mode] = {"before": true_before / checked_before, "after": true_after / checked_after,
                            "claims_before": checked_before, "claims_after": checked_after}
    return result or None


def _paired(out: pathlib.Path, files: tuple[str, str], envs: set[str] | None = None) -> dict | None:
    """The paired comparison (``paired_stats``) of two validation files of the run; None as ``_outcome_pair``."""
    pair = _outcome_pair(out, files, envs)
    return None if pair is None else paired_comparison(*pair).as_dict()


DEMONSTRATIONS_FILE = "demonstrations.json"  # in a warm start's folder: the environment and seeds it was shown


def demonstrated_seeds(model: str) -> dict[str, range]:
    """``{env name: seeds}`` of the demonstrations a warm start saved in folder ``model`` was trained on (this
    run's or an earlier run's, passed as ``--model``); empty for a model without the record (a built-in one)."""
    record = pathlib.Path(str(model)) / DEMONSTRATIONS_FILE
    if not record.is_file():
        return {}
    shown = json.loads(record.read_text())
    return {shown["env"]: range(*shown["seeds"])}


def trained_seeds_by_env(config, next_train: int) -> dict[str, list[int]]:
    """The seeds each training environment was reset with, training seeds ``train_seed_start`` to ``next_train``
    (the algorithm's seed schedule), ``num_groups`` per step, shared out as ``config.training_starts`` does."""
    seeds = list(range(config.train_seed_start, next_train))
    by_env: dict[str, list[int]] = {e.name: [] for e in config.training_environments()}
    for step in range(0, len(seeds), config.num_groups):
        for start in config.training_starts(seeds[step:step + config.num_groups]):
            name, seed = start if isinstance(start, tuple) else (config.env_name, start)
            by_env[name].append(seed)
    return by_env


def headline_environment(config) -> EnvEntry:
    """The validation environment a run's final table, paired statistics, baselines and held-out splits score: the
    first one that builds the first training environment (the same environment with the same arguments, whatever
    its name), else the first validation environment (a run that validates only on environments it does not train
    on, as a transfer study does)."""
    first = config.training_environments()[0]
    entries = config.validation_environments()
    return next((e for e in entries if (e.env, e.env_config) == (first.env, first.env_config)), entries[0])


def play_baseline(config, policy: Callable[[str], str], tokenizer) -> list:
    """A scripted ``policy`` on the headline environment's validation states, as many episodes per state
    as validation plays, in the same agent loop (prompts, budgets, transition seeds): the outcomes a run pairs
    its agent against (``run_job``'s ``baselines``)."""
    from .rollout.backends import SamplingParams, ScriptedBackend
    from .rollout.engine import RolloutEngine

    name = headline_environment(config).name
    starts = [s for s in config.validation_starts() if not isinstance(s, tuple) or s[0] == name]
    engine = RolloutEngine(config.rollout_config(), ScriptedBackend(policy, tokenizer), tokenizer)
    trajectories, _ = engine.rollout(starts, config.validation_group_size,
                                     SamplingParams(max_new_tokens=config.max_new_tokens_per_turn))
    return trajectories


def _against_baselines(config, out: pathlib.Path, baselines: dict) -> dict:
    """Per baseline: its success on the states it played, and the greedy agent paired against it before and after
    RL (``paired_stats``: "before" is the baseline, "after" the agent, so "improved" counts the states the agent
    solves and the baseline fails)."""
    names = {headline_environment(config).name}
    result = {}
    for name in baselines:
        outcomes = read_outcomes(out / baseline_file(name))
        result[name] = {"file": baseline_file(name), "states": len(outcomes),
                        "success": sum(outcomes.values()) / max(len(outcomes), 1)}
        for when, agent in (("warm_start", BEFORE_GREEDY_ROLLOUTS), ("after_rl", AFTER_GREEDY_ROLLOUTS)):
            result[name][when] = _paired(out, (baseline_file(name), agent), names)
    return result


def _held_out(config, out: pathlib.Path, trained: dict[str, list[int]]) -> dict | None:
    """Held-out success on the headline environment's validation states, split by whether training ever showed
    the state and by its optimal solution length (where the environment computes one), sampled and greedy
    (``held_out.py``). Training showed a state if a training environment that builds the same environment with
    the same arguments (whatever its name) was reset to it."""
    headline = headline_environment(config)
    builds = (headline.env, headline.env_config)
    pairs = {mode: _outcome_pair(out, files, {headline.name}) for mode, files in SAMPLED_AND_GREEDY.items()}
    pairs = {mode: pair for mode, pair in pairs.items() if pair is not None}
    if not pairs:
        return None
    states = next(iter(pairs.values()))[0].keys()
    seed_of = {state: state_of(state)[1] for state in states}
    described = initial_states(*builds, set(seed_of.values()), solution_lengths=True)
    trained_here = [seed for e in config.training_environments() if (e.env, e.env_config) == builds
                    for seed in trained.get(e.name, [])]
    seen = {key for key, _ in initial_states(*builds, trained_here).values()}
    seen_label = {s: "seen in training" if described[seed_of[s]][0] in seen else "unseen" for s in states}
    result = {"env": headline.name, "training_states": len(seen),
              "unseen_states": sum(label == "unseen" for label in seen_label.values()),
              "by_seen": {name: paired_by_subset(*pair, seen_label) for name, pair in pairs.items()}}
    lengths = {s: described[seed_of[s]][1] for s in states}
    if any(length is not None for length in lengths.values()):
        result["by_solution_length"] = {name: paired_by_subset(*pair, lengths) for name, pair in pairs.items()}
    return result


def _validation_summary(row: dict, config, counts: bool = True) -> str:
    """Validation success in a row: ``"0.172 on 256 held-out states"``, or per environment for a mixture."""
    entries = config.validation_environments()
    if not config.is_mixture:
        return f"{_validation_success(row, entries[0].name):.3f}" + f" on {entries[0].count} held-out states" * counts
    return "; ".join(f"{e.name} {_validation_success(row, e.name):.3f}" + f" ({e.count} states)" * counts
                     for e in entries)


def _print_paired(summary: dict, config) -> None:
    """The paired before/after lines of the final table: sampled, greedy, unseen states, by solution length."""
    for key, label in (("paired", f"paired, T={config.validation_temperature:g}"), ("paired_greedy", "paired, greedy")):
        if summary.get(key):
            print(f"{label:28s}{PairedComparison(**summary[key]).describe()}")
    for mode, grounded in (summary.get("reasoning_grounded") or {}).items():
        print(f"{'reasoning grounded, ' + mode:28s}{grounded['before']:.3f} -> {grounded['after']:.3f} of "
              f"{grounded['claims_before']} -> {grounded['claims_after']} checked claims about the state")
    for mode, entropy in (summary.get("reasoning_entropy") or {}).items():
        # log n is the most it can be: every episode reasoning differently
        print(f"{'reasoning entropy, ' + mode:28s}{entropy['before']:.3f} -> {entropy['after']:.3f} nats over "
              f"{entropy['episodes']} first turns (at most {math.log(max(entropy['episodes'], 1)):.2f})")
    if any(any(comparisons.values()) for comparisons in (summary.get("by_env") or {}).values()):
        print("validation environments, paired before -> after:")
        for env, comparisons in summary["by_env"].items():
            for mode, comparison in comparisons.items():
                if comparison:
                    print(f"  {env:40s}{mode:9s}{PairedComparison(**comparison).describe()}")
    for name, baseline in (summary.get("baselines") or {}).items():
        print(f"against the baseline '{name}' (it -> the greedy agent, on the same {baseline['states']} states):")
        for when, label in (("warm_start", "warm start"), ("after_rl", "after RL")):
            if baseline[when]:
                print(f"  {label:26s}{PairedComparison(**baseline[when]).describe()}")
    held_out = summary.get("held_out") or {}
    for name, subsets in held_out.get("by_seen", {}).items():
        if isinstance(subsets.get("unseen"), dict) and "p_value" in subsets["unseen"]:
            print(f"{'unseen states, ' + name:28s}{PairedComparison(**subsets['unseen']).describe()}")
    for name, subsets in held_out.get("by_solution_length", {}).items():
        cells = ", ".join(f"{length}: {c['before']:.2f}->{c['after']:.2f} (n={c['n']})" for length, c in subsets.items())
        print(f"{'by solution length, ' + name:28s}{cells}")


def _print_plan(config, job: JobSettings, out: pathlib.Path, warm_starts: bool) -> None:
    print(f"run folder: {out} ({pathlib.Path(job.output_dir) / LATEST} points here)", flush=True)
    steps = []
    if warm_starts and job.warm_start_steps > 0 and job.warm_start_episodes > 0 and not job.resume:
        cut = f" of at most {job.warm_start_max_turns} turns" if job.warm_start_max_turns else ""
        steps.append(f"warm start {job.warm_start_steps} steps on {job.warm_start_episodes} demonstrations{cut}")
    groups = " + ".join(f"{e.count} {e.name}" for e in config.training_environments()) \
        if config.train_envs else f"{config.num_groups}"
    steps.append(f"{job.iterations} StarPO iterations of {groups} groups x {config.group_size} episodes")
    states = ", ".join(f"{e.count} of {e.name}" for e in config.validation_environments()) \
        if config.is_mixture else f"{config.validation_size}"
    when = [*(["before RL"] if config.validate_before_training and not job.resume else []),
            *([f"every {config.validation_interval} iterations"] if config.validation_interval else [])]
    steps.append(f"validation on {states} held-out states {', '.join(when)}{' and ' if when else ''}"
                 "after the last iteration")
    # Measured with the job's defaults: flags (another model, more iterations) can change it a lot.
    estimate = (f"; with its default settings this job takes about {job.expected_minutes:g} min on a 2-core CPU"
                if job.expected_minutes else "")
    print(f"plan: {', '.join(steps)}{estimate}", flush=True)
    rules = [as_rule(r) for r in config.sentinel_rules]
    if rules:
        print(f"sentinel: {len(rules)} rules ({', '.join(f'{r.label}: {r.action}' for r in rules)})", flush=True)


class _Clock:
    """Time left from the iterations seen so far: a typical iteration (the median of those without validation,
    the first left out once there are others: it carries warm-up) times the iterations left, plus one
    validation's cost per validation left. One-off costs (warm start, model loading, the "before" validation)
    are not iterations and do not inflate it."""

    def __init__(self, iterations: int, validation_interval: int):
        self.iterations, self.interval = iterations, validation_interval
        self.plain: list[float] = []
        self.validating: list[float] = []
        self.validation_s: float | None = None  # one validation's cost, when the driver timed one
        self.first_s: float | None = None
        self.last_s = math.nan

    def record(self, seconds: float, validated: bool) -> None:
        if self.first_s is None:
            self.first_s = seconds  # warm-up (first passes through the model, allocator growth): not typical
        else:
            (self.validating if validated else self.plain).append(seconds)
        self.last_s = seconds

    def seconds_left(self, iteration: int) -> float:
        typical = statistics.median(self.plain or self.validating or [self.first_s])
        validation = self.validation_s
        if validation is None and self.validating and self.plain:
            validation = max(0.0, statistics.mean(self.validating) - typical)
        left = range(iteration + 1, self.iterations + 1)
        validations = sum(1 for i in left if self.interval and i % self.interval == 0)
        if self.iterations > iteration and not (self.interval and self.iterations % self.interval == 0):
            validations += 1  # the closing validation after the last iteration
        return typical * len(left) + (validation or 0.0) * validations


def flatten_result(result: dict, prefix: str = "") -> dict:
    """Scalar results as one flat row, each named by its path in the result (``env_runners/episode_return_mean``)."""
    row = {}
    for key, value in result.items():
        if key == "config":
            continue
        if isinstance(value, dict):
            row.update(flatten_result(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "item"):
            try:
                row[prefix + key] = float(value)
            except (TypeError, ValueError):
                continue
    return row


def _keep_validation(row: dict, validations: list[dict]) -> bool:
    """Remember a row's validation metrics once (rows between validations repeat or lack the last ones); True
    when the row brought a new validation."""
    validated_at = row.get(VALIDATED_AT, math.nan)
    if math.isfinite(validated_at) and (not validations or validations[-1][VALIDATED_AT] != validated_at):
        validations.append({k: v for k, v in row.items() if k.startswith(VALIDATION)})
        return True
    return False


def _validation_success(row: dict, env: str) -> float:
    return row.get(VALIDATION + M.env_metric(env, M.SUCCESS), math.nan)


def _print_progress(env: str, iterations: int, rows: list[dict], clock: _Clock) -> None:
    row = rows[-1]
    done = int(row["training_iteration"])
    key = TRAINING + M.env_metric(env, M.SUCCESS)
    smoothed = trailing_mean([r.get(key, math.nan) for r in rows[-SMOOTHING:]], SMOOTHING)[-1]
    print(f"iter {done:3d}/{iterations} | success {row.get(key, math.nan):.2f} ({SMOOTHING}-it mean {smoothed:.2f}) "
          f"| reward {row.get(TRAINING + M.EPISODE_RETURN_MEAN, math.nan):+.3f} "
          f"(in-group std {row.get(M.FILTER_REWARD_STD, math.nan):.3f}) "
          f"| entropy {row.get(LEARNER + M.ENTROPY, math.nan):.3f} "
          f"| format errors {row.get(TRAINING + M.env_metric(M.POOLED, M.FORMAT_ERROR_RATE), math.nan):.2f} "
          f"| {clock.last_s:.1f} s/it "
          f"| left ~{clock.seconds_left(done) / 60:.1f} min", flush=True)


def _summary(config, base_model: str, rows: list[dict], validations: list[dict], wall_s: float) -> dict:
    headline = headline_environment(config).name
    measured_before = bool(validations) and validations[0][VALIDATED_AT] == 0

    def val(index: int, name: str) -> float:
        key = VALIDATION + M.env_metric(headline, name)
        return validations[index].get(key, math.nan) if validations else math.nan

    pooled = TRAINING + M.POOLED + "/"
    generated = sum(r.get(pooled + M.RESPONSE_TOKENS_PER_TURN, 0) * r.get(pooled + M.NUM_TURNS, 0)
                    * r.get(pooled + M.NUM_TRAJECTORIES, 0) for r in rows)
    generate_s = sum(r.get(TRAINING + M.TIME_GENERATE, 0) for r in rows)
    return {
        "env": headline, "model": base_model, "iterations": len(rows),
        "validation_episodes": int(val(-1, M.NUM_TRAJECTORIES)) if validations else 0,
        "validation_temperature": config.validation_temperature,
        # NaN, not the first later validation, when nothing was measured before RL
        "before": {n: val(0, n) if measured_before else math.nan for n in SUMMARY_METRICS},
        "after": {n: val(-1, n) for n in SUMMARY_METRICS},
        "validated_at": [int(v[VALIDATED_AT]) for v in validations],
        "rollout_tokens_per_s": generated / generate_s if generate_s else math.nan,
        "update_tokens_per_s": rows[-1].get(LEARNER + M.UPDATE_TOKENS_PER_S, math.nan) if rows else math.nan,
        "wall_time_s": wall_s,
    }


def _print_table(summary: dict, config) -> None:
    print(f"\n{summary['env']}, model {summary['model']}, {summary['iterations']} iterations, validation on "
          f"{summary['validation_episodes']} held-out initial states (temperature {config.validation_temperature})")
    print(f"{'':28s}{'before':>10s}{'after':>10s}")

    def cell(value: float) -> str:
        return f"{value:10.3f}" if math.isfinite(value) else f"{'-':>10s}"

    for name in SUMMARY_METRICS:
        print(f"{name:28s}{cell(summary['before'][name])}{cell(summary['after'][name])}")
    print(f"{'rollout tokens/s':28s}{summary['rollout_tokens_per_s']:20,.0f}")
    print(f"{'update tokens/s':28s}{summary['update_tokens_per_s']:20,.0f}")
    print(f"{'wall time':28s}{summary['wall_time_s'] / 60:17.1f} min")
