"""One StarPO iteration of SmolLM2-135M on FrozenLake under the ``smollm2-cpu`` preset, timed phase by phase, beside
the same iteration as the release before this preset could run it.

The FrozenLake job's config with ``--preset smollm2-cpu`` (8 groups of 4 episodes, LoRA r = 16, mean-only GRPO,
micro-batches of one row (the baseline's: 4), the sampler and the learner's passes in bfloat16 where the CPU
computes it natively), started from a saved warm start so that both sides play the same policy. ``--baseline``
builds the same iteration from the settings the release before had (every one of these but the bfloat16 sampler,
which it did not have: it sampled in float32 and updated in float32); run it from a checkout of that release
(``PYTHONPATH=<checkout>``) to measure what an iteration cost there. The peak RSS is this process's (the job's trial
process: learner and sampler together), and on Linux each phase's peak (resident memory read every 20 ms): the job's
4 GB bar is on these.

``--validation-size N`` first validates N states, as the job does before RL; ``--set field=JSON`` and
``--model-config key=JSON`` change one setting of the preset, to measure what it saves or costs (e.g.
``--set micro_batch_size=4 --model-config activation_checkpointing=false``).

    python benchmarks/smollm2_iteration.py --model outputs/starpo_frozenlake/warm_starts/<key> [--iterations 4]
        [--validation-size 256] [--set field=JSON ...] [--model-config key=JSON ...]
    PYTHONPATH=<checkout of the release before> python benchmarks/smollm2_iteration.py --model ... --baseline
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from main_jobs import job_module  # noqa: E402


def build_config(model: str, baseline: bool):
    """The FrozenLake job's config for ``model``: under the preset, or (``baseline``) under the same settings spelt
    out without the settings this preset added."""
    config = job_module("starpo_frozenlake.py").config.copy(copy_frozen=False)
    if baseline:
        config.training(
            lr=1e-4,
            advantage_estimator="grpo",
            grpo_normalize_std=False,
            group_size=4,
            micro_batch_size=4,
            validation_interval=0,
        )
        config.rl_module(model_config={"model": model, "lora": {"r": 16}})
    else:
        config.preset("smollm2-cpu")
        config.rl_module(model_config={**config.model_config, "model": model})
    # No validation: the iteration alone (the job validates before and after RL, not every iteration).
    return config.training(validation_interval=0, validate_before_training=False).env_runners(num_env_runners=0)


class PhasePeaks:
    """Each phase's peak resident memory, from /proc/self/status every 20 ms (Linux; elsewhere nothing)."""

    def __init__(self):
        self.phase, self.peaks = "building", {}
        if os.path.exists("/proc/self/status"):
            threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            with open("/proc/self/status") as status:
                kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), kib / 2**20)
            time.sleep(0.02)

    def take(self) -> str:
        """The peaks since the last call, in GiB, and a fresh start."""
        text = ", ".join(f"{phase} {gib:.2f}" for phase, gib in self.peaks.items())
        self.peaks = {}
        return text


def settings(pairs: list[str], flag: str) -> dict:
    """``["key=JSON", ...]`` as a dict, each value parsed as JSON."""
    try:
        return {key: json.loads(value) for key, value in (pair.split("=", 1) for pair in pairs)}
    except ValueError as error:
        raise SystemExit(f"{flag} takes key=JSON, e.g. micro_batch_size=4 ({error})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a saved warm start of SmolLM2 (the job's warm_starts/<key>)")
    parser.add_argument("--iterations", type=int, default=4, help="timed after one untimed iteration")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", action="store_true", help="the settings of the release before (see above)")
    parser.add_argument("--validation-size", type=int, default=0, help="validate this many states first (0: none)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON", help="a training setting")
    parser.add_argument("--model-config", action="append", default=[], metavar="KEY=JSON", help="a model setting")
    args = parser.parse_args()

    import ray
    import torch

    import rllib_ragen

    torch.set_num_threads(args.threads)
    ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    config = build_config(args.model, args.baseline)
    config.training(**settings(args.set, "--set"))
    config.rl_module(model_config={**config.model_config, **settings(args.model_config, "--model-config")})
    if args.validation_size:
        config.training(validate_before_training=True, validation_size=args.validation_size)
    peaks = PhasePeaks()
    from rllib_ragen.starpo.starpo import StarPO

    StarPO.on_phase = staticmethod(lambda phase: setattr(peaks, "phase", phase))
    print(
        f"rllib_ragen from {os.path.dirname(rllib_ragen.__file__)}; "
        f"{'baseline (the release before: float32)' if args.baseline else 'the smollm2-cpu preset'}; "
        f"sampler {getattr(config, 'rollout_dtype', None) or 'float32'}, "
        f"learner {config.autocast_dtype or 'float32'}; micro-batches of {config.micro_batch_size}, "
        f"waves of {config.max_concurrent_episodes}, model_config {config.model_config}"
    )
    algo = config.build_algo()
    rows = []
    for iteration in range(args.iterations + 1):
        start = time.perf_counter()
        result = algo.train()
        wall = time.perf_counter() - start
        learner = result["learners"]["default_policy"]
        row = {
            "wall": wall,
            "sample": result["time/sample_s"],
            "update": result["time/update_s"],
            "update tokens/s": learner["perf/update_tokens_per_s"],
        }
        print(
            f"iteration {iteration + 1}{' (untimed)' if iteration == 0 else ''}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in row.items())
            + f"; peak RSS (GiB) {peaks.take()}",
            flush=True,
        )
        peaks.phase = "sampling"  # until the next iteration announces its first phase
        if iteration:
            rows.append(row)
    algo.stop()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"median of {len(rows)}: "
        + ", ".join(
            f"{k} {statistics.median(r[k] for r in rows):.1f}" for k in ("wall", "sample", "update", "update tokens/s")
        )
        + f" s; peak RSS {peak:.2f} GiB"
    )


if __name__ == "__main__":
    main()
