"""SmolLM2-135M's warm start on the FrozenLake job's demonstrations: peak resident memory and seconds per step.

The job's warm start as ``--preset smollm2-cpu`` runs it (bfloat16 autocast where the CPU computes it natively, batches
of 16 demonstrations grouped by length), with the settings that decide its memory given on the command line: rows per
pass, activation checkpointing, whether freed heap pages go back to the system after every step (the default since
2026-12-06; ``--no-trim`` is the release before), and LoRA adapters instead of every weight (``--lora-rank``, with its
``--lr``; tried on 2026-12-06, not the preset's: the FrozenLake results page). Resident memory is read every 20 ms
(Linux); each step's peak and the memory held after it are printed. Their growth over the steps was torch's kernel
caches, which ``rllib_ragen.hardware`` bounds: ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024`` (oneDNN's default) and
``LRU_CACHE_CAPACITY=1024`` (ideep's, torch's default) show them unbounded.

    python benchmarks/warm_start_memory.py [--steps 20] [--episodes 1200] [--micro-batch-size 4]
        [--checkpointing] [--no-trim] [--lora-rank 16 --lr 1e-3] [--freeze-embeddings]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch

import rllib_ragen.warm_start as warm_start_module
from rllib_ragen.hardware import cpu_computes_bfloat16
from rllib_ragen.jobs.settings import JobSettings
from rllib_ragen.jobs.warm_start import demonstration_rollout_config
from rllib_ragen.rollout.models import enable_activation_checkpointing, load_policy

from main_jobs import demonstration_policy, job_module  # benchmarks/


def resident_gib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=1200, help="demonstrations (the preset: 1,200)")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--checkpointing", action="store_true", help="re-run each layer in the backward pass")
    parser.add_argument("--no-trim", action="store_true", help="keep freed heap pages between steps")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank (0: every weight)")
    parser.add_argument("--lr", type=float, default=1e-4, help="the preset's: 1e-4 for every weight, 1e-3 for LoRA")
    parser.add_argument("--freeze-embeddings", action="store_true", help="keep the (tied) embeddings and head fixed")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not os.path.exists("/proc/self/status"):
        raise SystemExit("reads /proc/self/status: Linux only")
    torch.set_num_threads(args.threads)
    peak = [0.0]

    def watch() -> None:
        while True:
            peak[0] = max(peak[0], resident_gib())
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    config = job_module("starpo_frozenlake.py").config.copy(copy_frozen=False).preset("smollm2-cpu")
    model, tokenizer = load_policy("smollm2-135m")
    if args.checkpointing:
        enable_activation_checkpointing(model)
    demonstrations = warm_start_module.collect_demonstrations(
        demonstration_rollout_config(config, JobSettings()), demonstration_policy(config), tokenizer, args.episodes
    )
    if args.no_trim:
        warm_start_module.trim_heap = lambda: False
    loaded = resident_gib()
    step_peak = [0.0]

    def after_step(done: int, loss: float) -> None:
        print(
            f"  step {done}: peak {step_peak[0]:.2f} GiB, {resident_gib():.2f} GiB held after it, loss {loss:.4f}",
            flush=True,
        )
        step_peak[0] = 0.0

    def watch_step() -> None:
        while True:
            step_peak[0] = max(step_peak[0], resident_gib())
            time.sleep(0.02)

    threading.Thread(target=watch_step, daemon=True).start()
    start = time.perf_counter()
    losses = warm_start_module.supervised_warm_start(
        model,
        demonstrations,
        steps=args.steps,
        batch_size=16,
        lr=args.lr,
        seed=0,
        pad_token_id=tokenizer.pad_token_id,
        group_by_length=True,
        micro_batch_size=args.micro_batch_size,
        lora_rank=args.lora_rank,
        freeze_embeddings=args.freeze_embeddings,
        precision="bfloat16" if cpu_computes_bfloat16() else "float32",
        log_every=0,
        progress=after_step,
    )
    seconds = (time.perf_counter() - start) / args.steps
    print(
        f"micro-batches of {args.micro_batch_size}, checkpointing {args.checkpointing}, trim after each step "
        f"{not args.no_trim}, LoRA rank {args.lora_rank} (lr {args.lr:g}), embeddings frozen {args.freeze_embeddings}, "
        f"oneDNN kernels kept "
        f"{os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY')}, ideep products kept "
        f"{os.environ.get('LRU_CACHE_CAPACITY')}: {seconds:.1f} s a step, peak RSS {peak[0]:.2f} GiB "
        f"({loaded:.2f} GiB loaded, before the first step); loss {losses[0]:.4f} -> {losses[-1]:.4f}"
    )


if __name__ == "__main__":
    main()
