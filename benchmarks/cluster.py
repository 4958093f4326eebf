"""Scale-out on one machine: env runners over nodes, data-parallel learners, and the weight broadcast.

Starts a ``ray.cluster_utils.Cluster`` in this process: a head node without CPUs (the driver) and two worker nodes
of one CPU each, so every actor has a node (and one torch thread) to itself. Then, on the Sokoban config of the
tests (tiny model, ``--groups`` groups of 4, 2 turns, 24 new tokens per reply), in one run:

- rollout throughput (generated tokens/s) with 1 env runner (one node) and 2 (one per node);
- update time with 1 remote learner and 2 (torch DDP over gloo, one per node), the same batch size;
- the weight broadcast after each update: seconds and bytes, to runners on one node and on two.

It prints each figure, the 2-against-1 ratios, and the arithmetic that carries them to 8 nodes x 8 GPUs.

    python benchmarks/cluster.py [--iterations 3] [--groups 4]
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from rllib_ragen import StarPOConfig  # noqa: E402
from rllib_ragen import metrics as M  # noqa: E402


def base_config(groups: int) -> StarPOConfig:
    return (
        StarPOConfig()
        .environment("rllib_ragen/Sokoban-v0")
        .rl_module(model_config={"model": "tiny"})
        .training(
            num_groups=groups,
            group_size=4,
            max_turns=2,
            max_new_tokens_per_turn=24,
            validation_interval=0,
            validate_before_training=False,
            collapse_diagnostics_interval=0,
            rollout_filter_ratio=1.0,
            lr=1e-4,
            critic_lr=1e-4,
        )
        .debugging(seed=0)
    )


def measure(config: StarPOConfig, iterations: int) -> dict[str, float]:
    """Median seconds of the rollout, update and weight sync over ``iterations`` (after one to warm up), the
    generated tokens per rollout and the bytes of one weight broadcast."""
    algo = config.build_algo()
    try:
        results, tokens = [], []
        for _ in range(iterations + 1):
            results.append(algo.train())
            tokens.append(sum(sum(t.response_mask) for t in algo.last_rollout))
        state = algo.env_runner.module.get_state()
        weight_bytes = sum(v.numel() * v.element_size() for k, v in state.items() if k.startswith("policy."))
    finally:
        algo.stop()
    timed = results[1:]
    return {
        "rollout_s": statistics.median(r[M.TIME_SAMPLE] for r in timed),
        "update_s": statistics.median(r[M.TIME_UPDATE] for r in timed),
        "sync_s": statistics.median(r[M.TIME_SYNC] for r in timed),
        "tokens": statistics.median(tokens[1:]),
        "weight_bytes": weight_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4)
    args = parser.parse_args()

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        config = base_config(args.groups)
        runs = {
            "1 env runner, 1 node": config.copy(copy_frozen=False).env_runners(num_env_runners=1),
            "2 env runners, 2 nodes": config.copy(copy_frozen=False).env_runners(num_env_runners=2),
            # the rollout in the driver (no CPU on the head: it does not count against the learners' nodes)
            "1 learner": config.copy(copy_frozen=False).learners(num_learners=1),
            "2 learners (DDP)": config.copy(copy_frozen=False).learners(num_learners=2),
        }
        figures = {name: measure(run, args.iterations) for name, run in runs.items()}
    finally:
        ray.shutdown()
        cluster.shutdown()

    print(
        f"tiny model, Sokoban, {args.groups} groups x 4 episodes, 2 turns, 24 new tokens; medians of "
        f"{args.iterations} iterations; each actor on a 1-CPU node of its own"
    )
    for name, f in figures.items():
        print(
            f"  {name:24s} rollout {f['rollout_s']:6.2f} s ({f['tokens'] / f['rollout_s']:7.1f} tokens/s)  "
            f"update {f['update_s']:6.2f} s  weight sync {f['sync_s'] * 1e3:7.1f} ms"
        )
    one, two = figures["1 env runner, 1 node"], figures["2 env runners, 2 nodes"]
    rollout_speedup = (two["tokens"] / two["rollout_s"]) / (one["tokens"] / one["rollout_s"])
    update_speedup = figures["1 learner"]["update_s"] / figures["2 learners (DDP)"]["update_s"]
    megabytes = one["weight_bytes"] / 1e6
    sync_per_node = two["sync_s"] - one["sync_s"]
    print(f"rollout throughput, 2 runners / 1: {rollout_speedup:.2f}x (ideal 2x)")
    print(f"update time, 1 learner / 2: {update_speedup:.2f}x (ideal 2x)")
    print(
        f"weight broadcast of {megabytes:.1f} MB: {one['sync_s'] * 1e3:.1f} ms to 1 node, "
        f"{two['sync_s'] * 1e3:.1f} ms to 2 ({sync_per_node * 1e3:+.1f} ms for the second node: "
        f"{megabytes / max(sync_per_node, 1e-9):.0f} MB/s)"
    )

    # 8 nodes x 8 GPUs, a 0.5B-parameter policy in bfloat16 (Qwen2.5-0.5B): the same three costs as arithmetic.
    policy_gb, link_gb_s, nodes = 0.99, 12.5, 8  # 100 Gb/s between nodes
    print("\nexpected at 8 nodes x 8 GPUs (0.5B policy, bf16: 0.99 GB; 100 Gb/s = 12.5 GB/s between nodes):")
    print(
        f"  weight broadcast: one object per update, pulled once per node; from the head alone "
        f"{nodes - 1} x {policy_gb} GB / {link_gb_s} GB/s = {(nodes - 1) * policy_gb / link_gb_s:.2f} s, at most "
        f"(Ray also pulls from nodes that already hold a copy). On this machine the second node cost "
        f"{sync_per_node * 1e3:.0f} ms for {megabytes:.0f} MB."
    )
    print(
        f"  rollouts: groups split evenly over runners, so throughput grows with runners while each keeps a "
        f"full generation batch; measured here {rollout_speedup:.2f}x for 2 (ideal 2x)."
    )
    print(
        f"  updates: each of 64 learners trains 1/64 of the kept groups and all-reduces gradients "
        f"(2 x {policy_gb} GB per step over {link_gb_s} GB/s ring: {2 * policy_gb / link_gb_s:.2f} s); measured here "
        f"{update_speedup:.2f}x for 2 learners. Keep at least one group per learner: kept groups >= learners."
    )
    print(
        f"  what limits the 2-core figures: two 1-CPU nodes share this machine's 2 cores with the driver, so "
        f"neither ratio can reach 2x when the driver or Ray's own processes are busy. Ratios: "
        f"{np.round([rollout_speedup, update_speedup], 2).tolist()}."
    )


if __name__ == "__main__":
    main()
