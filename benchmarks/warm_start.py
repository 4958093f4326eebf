"""Supervised warm-start steps: the shared prompt read once, length-grouped batches and bfloat16 autocast, against
the plain pass.

Collects a main job's demonstrations (its config and demonstration policy, the tiny model's tokenizer), then runs
``supervised_warm_start`` for the same number of steps from the same initial weights four times: every row through
the whole model (``model(...)``, the warm start before ``forward_sharing_prefix``), the prefix all rows share read
once (the default), that plus ``group_by_length=True``, and the default with ``precision="bfloat16"``. Prints
seconds per step, padded tokens per batch and the share of them that are real, the loss, and each one's speed-up
over the first.

With ``--preset`` (``smollm2-cpu``) it times the job's own warm start under that preset instead (its model,
demonstrations, micro-batches, fixed embeddings and dtype; ``--steps`` steps on ``--episodes`` demonstrations), with
and without activation checkpointing, each in a fresh process (``--rounds`` times, alternated, as the machine's noise
is large): seconds from loading the model to saving it, each process's peak resident set, and the ratio of the means.

    python benchmarks/warm_start.py [--job frozenlake|sokoban] [--steps 60] [--episodes 1000] [--threads 2]
    python benchmarks/warm_start.py --preset smollm2-cpu [--steps 4] [--episodes 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import resource
import subprocess
import sys
import time

import numpy as np
import torch

import rllib_ragen.warm_start as warm_start_module
from rllib_ragen.jobs.flags import PRESET_JOBS
from rllib_ragen.jobs.warm_start import demonstration_rollout_config
from rllib_ragen.rollout.models import forward_sharing_prefix, load_policy
from rllib_ragen.warm_start import collect_demonstrations, demonstration_batches, supervised_warm_start

from main_jobs import demonstration_policy, job_module  # benchmarks/

JOBS = {"frozenlake": "starpo_frozenlake.py", "sokoban": "starpo_sokoban.py"}


def padding(lengths: list[int], batch_size: int, steps: int, group_by_length: bool) -> tuple[float, float]:
    """Mean padded tokens per batch and the share of them that are real, over the steps the warm start takes."""
    batches = demonstration_batches(lengths, batch_size, torch.Generator().manual_seed(0), group_by_length)
    padded, real = 0, 0
    for _ in range(steps):
        batch = next(batches)
        padded += len(batch) * max(lengths[i] for i in batch)
        real += sum(lengths[i] for i in batch)
    return padded / steps, real / padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="frozenlake")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--preset", choices=sorted(PRESET_JOBS), help="time this CPU preset's own warm start")
    parser.add_argument("--rounds", type=int, default=3, help="with --preset: runs of each variant, alternated")
    parser.add_argument("--checkpointing", choices=["on", "off"], help=argparse.SUPPRESS)  # one child process's run
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.preset:
        return preset_run(args) if args.checkpointing else preset_checkpointing(args)
    module = job_module(JOBS[args.job])
    config, job = module.config, module.job
    _, tokenizer = load_policy("tiny", seed=0)
    demos = collect_demonstrations(
        demonstration_rollout_config(config, job), demonstration_policy(config), tokenizer, args.episodes
    )
    lengths = [len(t.token_ids) for t in demos]
    print(
        f"{args.job}: {len(demos)} demonstrations, {np.mean(lengths):.0f} tokens on average "
        f"({min(lengths)}-{max(lengths)}); batch {job.warm_start_batch_size}, {args.steps} steps, "
        f"{args.threads} threads"
    )

    def plain_pass(model, ids, attention):
        return {"logits": model(input_ids=ids, attention_mask=attention, use_cache=False).logits}

    rows = {}
    for name, logits_fn, grouped, precision in (
        ("every row whole", plain_pass, False, "float32"),
        ("shared prefix", forward_sharing_prefix, False, "float32"),
        ("shared + grouped", forward_sharing_prefix, True, "float32"),
        ("shared, bfloat16", forward_sharing_prefix, False, "bfloat16"),
    ):
        warm_start_module.forward_sharing_prefix = logits_fn
        model, _ = load_policy("tiny", seed=0)
        supervised_warm_start(
            model,
            demos,
            steps=3,
            batch_size=job.warm_start_batch_size,
            lr=job.warm_start_lr,
            pad_token_id=tokenizer.pad_token_id,
            log_every=0,
            precision=precision,
        )  # warm-up: allocator, kernels
        model, _ = load_policy("tiny", seed=0)
        t0 = time.perf_counter()
        losses = supervised_warm_start(
            model,
            demos,
            steps=args.steps,
            batch_size=job.warm_start_batch_size,
            lr=job.warm_start_lr,
            pad_token_id=tokenizer.pad_token_id,
            log_every=0,
            group_by_length=grouped,
            precision=precision,
        )
        seconds = (time.perf_counter() - t0) / args.steps
        tokens, real_share = padding(lengths, job.warm_start_batch_size, args.steps, grouped)
        rows[name] = seconds
        print(
            f"{name:17s} {seconds:.3f} s/step | {tokens:,.0f} padded tokens per batch, {real_share:.0%} real | "
            f"loss {losses[0]:.3f} -> {np.mean(losses[-10:]):.3f} (mean of the last 10) | "
            f"speed-up {rows['every row whole'] / seconds:.2f}x"
        )
    warm_start_module.forward_sharing_prefix = forward_sharing_prefix


def preset_run(args) -> None:
    """One child process: the job's own warm start under the preset, cut to ``args.steps`` steps on
    ``args.episodes`` demonstrations, printed as one JSON line (its seconds from loading the model to saving it)."""
    import tempfile

    from rllib_ragen.jobs.warm_start import warm_start

    module = job_module(JOBS[args.job])
    config = module.config.copy(copy_frozen=False)
    config.preset(args.preset)
    cut = dict(
        warm_start_steps=args.steps,
        warm_start_episodes=args.episodes,
        warm_start_eval_interval=0,
        warm_start_activation_checkpointing=args.checkpointing == "on",
    )
    job = dataclasses.replace(module.job, **{**PRESET_JOBS[args.preset], **cut})
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        warm_start(config, job, demonstration_policy(config), pathlib.Path(folder))
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(json.dumps({"seconds": seconds, "peak_rss_gib": peak}))


def preset_checkpointing(args) -> None:
    """The preset's warm start with and without activation checkpointing, each run in its own process (a fresh
    peak resident set), alternated ``args.rounds`` times."""
    print(
        f"{args.preset} warm start ({args.job}): {args.steps} steps on {args.episodes} demonstrations, "
        f"{args.threads} threads; torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    runs = {"on": [], "off": []}
    for _ in range(args.rounds):
        for setting in runs:
            command = [sys.executable, __file__, "--preset", args.preset, "--job", args.job, "--checkpointing", setting]
            command += ["--steps", str(args.steps), "--episodes", str(args.episodes), "--threads", str(args.threads)]
            child = subprocess.run(command, capture_output=True, text=True)
            if child.returncode:
                raise SystemExit(f"{' '.join(command)} failed:\n{child.stderr}")
            run = json.loads(child.stdout.strip().splitlines()[-1])
            runs[setting].append(run)
            print(f"checkpointing {setting:3s}: {run['seconds']:.1f} s, peak RSS {run['peak_rss_gib']:.2f} GiB")
    mean = {setting: np.mean([run["seconds"] for run in done]) for setting, done in runs.items()}
    print(
        f"mean {mean['on']:.1f} s with checkpointing, {mean['off']:.1f} s without: {mean['on'] / mean['off']:.2f}x; "
        f"peak RSS {max(r['peak_rss_gib'] for r in runs['on']):.2f} GiB with, "
        f"{max(r['peak_rss_gib'] for r in runs['off']):.2f} GiB without"
    )


if __name__ == "__main__":
    main()
