"""The main jobs' warm-start step: the job's demonstrations played, SmolLM2 or the tiny model fine-tuned on them
(:mod:`rllib_ragen.warm_start`, the library half), and the result cached under ``<output_dir>/warm_starts/<key>/``,
keyed by every setting the weights depend on, so that later runs, seeds and trials with the same settings reuse it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import pathlib
import shutil
import sys
import time
from typing import Callable

import torch

from ..hardware import release_freed_memory
from ..progress import Progress
from ..warm_start import DEMONSTRATION_SEED_START, collect_demonstrations, supervised_warm_start
from .outputs import WARM_START_CURVE, write_csv
from ..files import write_text_atomically
from .validation_states import DEMONSTRATIONS_FILE

logger = logging.getLogger("rllib_ragen.warm_start")  # the library's: its every-50-steps loss lines

WARM_STARTS = "warm_starts"  # in a job's output folder: one warm-start model per distinct set of settings


def cached_warm_start(config, job, policy: Callable[[str], str]) -> str:
    """The warm-start model for ``config`` and ``job`` (a :class:`~rllib_ragen.jobs.settings.JobSettings`):
    trained once into ``<output_dir>/warm_starts/<key>/`` (``key``: :func:`warm_start_key`), then reused by every
    later run, seed and trial with the same settings. Written to a side folder and renamed, so a killed warm start
    leaves no cache behind."""
    key = warm_start_key(config, job, policy)
    path = pathlib.Path(job.output_dir).resolve() / WARM_STARTS / key
    if (path / "config.json").is_file():
        print(f"warm start: reusing {path} (the same settings)", flush=True)
        return str(path)
    partial = path.with_name(f"{key}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    warm_start(config, job, policy, partial)
    # The warm start's activations and optimizer moments are freed, but glibc keeps their pages: without this the
    # job's driver holds them (several GiB for SmolLM2) while the trials train.
    release_freed_memory()
    try:
        os.replace(partial, path)
    except OSError:  # another job trained the same warm start meanwhile: use theirs
        shutil.rmtree(partial, ignore_errors=True)
    return str(path)


# Warm-start settings that change how the same weights are computed, not which (tested to the bit): a cached warm
# start serves either value.
WEIGHTLESS_WARM_START_SETTINGS = {"warm_start_activation_checkpointing"}
# Settings added after warm starts were cached: in the key only when set, so the caches made before them stay valid.
KEYED_WHEN_SET = {"warm_start_freeze_embeddings"}


def warm_start_key(config, job, policy: Callable[[str], str]) -> str:
    """A short hash of what the warm start depends on: the model, the demonstrations' agent loop, the policy that
    plays them (its name and the plain values it closes over), the ``warm_start_*`` settings and the seed."""
    closure = [c.cell_contents for c in getattr(policy, "__closure__", None) or ()]
    settings = {
        "model": str(config.model_config["model"]),
        "dtype": str(config.model_config.get("dtype")),
        "seed": config.seed or 0,
        "rollout": repr(demonstration_rollout_config(config, job)),
        "policy": f"{getattr(policy, '__module__', '')}.{getattr(policy, '__qualname__', type(policy).__name__)}",
        "policy_values": [repr(v) for v in closure if isinstance(v, (bool, int, float, str, type(None)))],
        "job": {
            f.name: getattr(job, f.name)
            for f in dataclasses.fields(job)
            if f.name.startswith("warm_start")
            and f.name not in WEIGHTLESS_WARM_START_SETTINGS
            and not (f.name in KEYED_WHEN_SET and getattr(job, f.name) == f.default)
        },
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def demonstration_rollout_config(config, job):
    """The agent loop the demonstrations are played in: the config's, cut to ``job.warm_start_max_turns`` turns when
    that is set. The prompts do not state the turn budget, so a cut demonstration is the first turns of a whole one."""
    rollout_config = config.rollout_config()
    if job.warm_start_max_turns:
        rollout_config = dataclasses.replace(rollout_config, max_turns=job.warm_start_max_turns)
    return rollout_config


def warm_start(config, job, policy: Callable[[str], str], path: pathlib.Path) -> str:
    """Fine-tune the config's model on ``policy``'s demonstrations with ``job``'s ``warm_start_*`` settings; save it
    to ``path``, with the demonstrated states (``demonstrations.json``), and return that path."""
    from ..rollout.models import enable_activation_checkpointing, load_policy

    t0 = time.perf_counter()
    if not logger.handlers:  # the every-50-steps loss lines are the job's progress
        logger.addHandler(logging.StreamHandler(sys.stdout))
        logger.setLevel(logging.INFO)
    seed = config.seed or 0
    model, tokenizer = load_policy(config.model_config["model"], seed=seed)
    if job.warm_start_activation_checkpointing:  # the same weights to the bit, in less memory
        enable_activation_checkpointing(model)
    device = warm_start_device(config, job.warm_start_device)
    model.to(device)
    with Progress(job.warm_start_episodes, "warm start: demonstrations", "episodes") as shown:
        demos = collect_demonstrations(
            demonstration_rollout_config(config, job),
            policy,
            tokenizer,
            job.warm_start_episodes,
            progress=lambda done, _: shown.update(done),
        )
    longest = max(end - start for t in demos for start, end in t.turn_spans)
    if longest > config.max_new_tokens_per_turn:  # RL would cut such replies short: a format error every time
        raise ValueError(
            f"A demonstrated reply takes {longest} tokens, more than max_new_tokens_per_turn="
            f"{config.max_new_tokens_per_turn} lets the policy write; raise it to at least {longest} "
            f"(--max-new-tokens-per-turn {longest}) or demonstrate shorter replies."
        )
    path.mkdir(parents=True, exist_ok=True)  # the validation curve is written beside the model as it trains
    curve = (
        validation_greedy_curve(config, tokenizer, path / WARM_START_CURVE) if job.warm_start_eval_interval else None
    )
    shown = Progress(job.warm_start_steps, "warm start", "steps")
    losses = supervised_warm_start(
        model,
        demos,
        steps=job.warm_start_steps,
        batch_size=job.warm_start_batch_size,
        lr=job.warm_start_lr,
        seed=seed,
        pad_token_id=tokenizer.pad_token_id,
        average_decay=job.warm_start_average_decay,
        lr_schedule=job.warm_start_lr_schedule,
        group_by_length=job.warm_start_group_by_length,
        micro_batch_size=job.warm_start_micro_batch_size,
        lora_rank=job.warm_start_lora_rank,
        freeze_embeddings=job.warm_start_freeze_embeddings,
        precision=job.warm_start_precision,
        evaluate=curve and functools.partial(curve, model),
        evaluate_every=job.warm_start_eval_interval,
        progress=lambda done, loss: shown.update(done, loss=loss),
    )
    shown.close()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    # Which states the model was shown, so that a run started later from this folder (--model) still counts them
    # as seen in its validation report.
    write_text_atomically(
        path / DEMONSTRATIONS_FILE,
        json.dumps(
            {"env": config.env_name, "seeds": [DEMONSTRATION_SEED_START, DEMONSTRATION_SEED_START + len(demos)]}
        ),
    )
    print(
        f"warm start: {len(demos)} demonstrations ({sum(t.success for t in demos) / len(demos):.0%} successful), "
        f"{job.warm_start_steps} steps on {device} ({torch.get_num_threads()} threads), "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
        f"{time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    return str(path)


def warm_start_device(config, setting: str) -> torch.device:
    """The warm start's device for ``setting`` (``JobSettings.warm_start_device``). 'learner': the learner's GPU
    (``local_gpu_idx``) when the config gives learners GPUs and this process sees one, else the CPU; a visible GPU
    alone changes nothing, as for the rest of the job."""
    if setting != "learner":
        return torch.device(setting)
    if (config.num_gpus_per_learner or 0) > 0 and torch.cuda.is_available():
        return torch.device("cuda", config.local_gpu_idx)
    return torch.device("cpu")


def validation_greedy_curve(config, tokenizer, path: pathlib.Path) -> Callable[[torch.nn.Module, int, str], None]:
    """``evaluate(model, step, weights)`` for the warm start: plays the config's validation states greedily with
    ``model`` as it is (``StarPO.play_validation_states_with``), adds a row (step, weights, greedy success pooled and
    per environment, format errors) to the CSV at ``path``, rewritten whole each time so that a stopped run keeps
    its points, and prints it."""
    from .. import metrics as M
    from ..rollout.trajectory import rollout_metrics
    from ..starpo import StarPO

    rows: list[dict] = []

    def evaluate(model, step: int, weights: str) -> None:
        t0 = time.perf_counter()
        trajectories = StarPO.play_validation_states_with(config, model, tokenizer, temperature=0.0)
        metrics = rollout_metrics(trajectories, config.validation_group_size)
        row = {
            "step": step,
            "weights": weights,
            M.SUCCESS: metrics[M.env_metric(M.POOLED, M.SUCCESS)],
            M.FORMAT_ERROR_RATE: metrics[M.env_metric(M.POOLED, M.FORMAT_ERROR_RATE)],
        }
        if config.is_mixture:
            row.update(
                {
                    M.env_metric(e.name, M.SUCCESS): metrics.get(M.env_metric(e.name, M.SUCCESS), math.nan)
                    for e in config.validation_environments()
                }
            )
        rows.append(row)
        write_csv(path, rows)
        print(
            f"warm start step {step}: greedy success {row[M.SUCCESS]:.3f} on {len(trajectories)} validation "
            f"episodes ({weights} weights; format errors {row[M.FORMAT_ERROR_RATE]:.2f} of turns; "
            f"{time.perf_counter() - t0:.0f} s)",
            flush=True,
        )

    return evaluate
