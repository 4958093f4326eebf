"""A Ray cluster of several nodes on this machine: the README's ``ray job submit`` command against a real
``ray start --head`` (with its job server on 127.0.0.1) and a worker node, a sweep whose trials run on both nodes
and write into one storage folder; env runners on other nodes (placement, rollouts, weight copies, a lost node)."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
RAY = str(pathlib.Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_ports() -> list[str]:
    """Every fixed port a node listens on, free ones: two nodes on one machine must not both take Ray's defaults.
    Worker ports stay in Ray's default range (10002-19999), below the ephemeral ports these are drawn from, so
    they cannot collide with them."""
    return [
        f"--node-manager-port={_free_port()}",
        f"--object-manager-port={_free_port()}",
        f"--metrics-export-port={_free_port()}",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--dashboard-agent-grpc-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}",
    ]


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory):
    """``ray start --head`` (1 CPU, dashboard and job server on 127.0.0.1) and ``ray start --address`` (1 CPU), each
    with ``--block``: stopping those two processes stops everything they started, and nothing else."""
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "CUDA_VISIBLE_DEVICES": "",
        "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    gcs, dashboard = _free_port(), _free_port()
    # One temporary folder per node (short: Ray's socket paths must stay under 108 characters). Sharing one, two
    # nodes on one machine unpack the job's working directory into the same place and delete it under each other.
    temp_dirs = [tmp_path_factory.mktemp("ray_head"), tmp_path_factory.mktemp("ray_worker")]
    logs = temp_dirs[0] / "nodes.log"
    with open(logs, "w") as log:
        head = subprocess.Popen(
            [
                RAY,
                "start",
                "--head",
                "--block",
                f"--port={gcs}",
                "--node-ip-address=127.0.0.1",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--ray-client-server-port={_free_port()}",
                "--num-cpus=1",
                f"--temp-dir={temp_dirs[0]}",
                "--disable-usage-stats",
                *_node_ports(),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        processes = [head]
        try:
            address = f"http://127.0.0.1:{dashboard}"
            _wait_for(lambda: _get_json(f"{address}/api/version"), "the head node's dashboard", logs)
            processes.append(
                subprocess.Popen(
                    [
                        RAY,
                        "start",
                        "--block",
                        f"--address=127.0.0.1:{gcs}",
                        "--node-ip-address=127.0.0.1",
                        "--num-cpus=1",
                        f"--temp-dir={temp_dirs[1]}",
                        *_node_ports(),
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            _wait_for(lambda: len(_alive_nodes(address)) == 2, "the worker node to join", logs)
            yield address, env
        finally:
            for process in reversed(processes):
                process.terminate()
                process.wait(timeout=60)


def _get_json(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except OSError:
        return None


def _alive_nodes(address: str) -> list[str]:
    from ray.util.state import list_nodes

    try:
        return [n.node_id for n in list_nodes(address=address, filters=[("state", "=", "ALIVE")])]
    except Exception:  # the state API answers once the head is up
        return []


def _wait_for(condition, what: str, logs: pathlib.Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s} s for {what}; node logs:\n{logs.read_text()[-3000:]}")
        time.sleep(1)


def test_the_readmes_job_submit_runs_a_sweep_over_both_nodes_into_one_storage_folder(two_node_cluster, tmp_path):
    from ray.util.state import list_actors

    address, env = two_node_cluster
    storage = tmp_path / "runs"  # one folder both nodes write to (a shared file system on a real cluster)
    budget = [
        "--iterations",
        "2",
        "--num-groups",
        "2",
        "--group-size",
        "4",
        "--validation-size",
        "8",
        "--warm-start-episodes",
        "16",
        "--warm-start-steps",
        "5",
        "--max-new-tokens-per-turn",
        "24",
    ]
    done = subprocess.run(
        [
            RAY,
            "job",
            "submit",
            "--address",
            address,
            "--working-dir",
            ".",
            "--",
            "python",
            "tuned_examples/starpo_bandit.py",
            *budget,
            "--seeds",
            "0,1",
            "--output-dir",
            str(storage),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "succeeded" in done.stdout + done.stderr, (done.stdout + done.stderr)[-12000:]
    experiment = (storage / "latest").resolve()
    for seed in (0, 1):
        rows = [json.loads(line) for line in (experiment / f"seed{seed}" / "result.json").read_text().splitlines()]
        assert [row["training_iteration"] for row in rows] == [1, 2]
    assert json.loads((experiment / "summary.json").read_text())
    # The trials ran in this cluster, one on each node (each node has one CPU, each trial takes one).
    trials = list_actors(address=address, filters=[("class_name", "=", "StarPO")], detail=True)
    assert len(trials) == 2 and len({t.node_id for t in trials}) == 2


@pytest.fixture
def three_node_cluster():
    """``ray.cluster_utils.Cluster``: a head without CPUs (the driver and its learner live there) and two worker
    nodes of 2 CPUs, in this process's Ray; the shared one-node Ray is stopped first and restarted by the next test
    that asks for it."""
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()


def _runner_nodes(algo) -> dict[int, str]:
    import ray

    return dict(
        algo.env_runner_group.foreach_env_runner(
            lambda runner: (runner.worker_index, ray.get_runtime_context().get_node_id()), local_env_runner=False
        )
    )


def test_env_runners_on_other_nodes_play_the_one_node_rollouts_and_survive_a_lost_node(
    three_node_cluster, small_config, monkeypatch
):
    import numpy as np
    import ray
    import torch
    from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    from rllib_ragen.envs import register_text_env

    cluster, workers = three_node_cluster
    head = cluster.head_node.node_id
    # An environment registered by id in this process only: the config carries it to the other nodes' runners.
    register_text_env("driveronly/Sokoban-v0", "rllib_ragen.envs.sokoban:SokobanEnv")
    config = small_config(
        "driveronly/Sokoban-v0", num_groups=3, validation_interval=0, validate_before_training=False
    ).env_runners(num_env_runners=3)

    # Where the runners are: all on the worker nodes, over both of them.
    algo = config.build_algo()
    try:
        nodes = _runner_nodes(algo)
        assert head not in nodes.values() and set(nodes.values()) == {w.node_id for w in workers}

        # Their rollouts are those of a one-node run: each runner's groups, replayed by the driver's own runner
        # with the runner's sampling seed, give the same tokens and log-probs.
        sampling, seeds = config.sampling_params(), [0, 1, 2]
        remote, _ = algo.rollouts.play(seeds, config.group_size, sampling, sample_seed=11)
        local = []
        for index, chunk in zip(sorted(nodes), np.array_split(np.array(seeds), len(nodes))):
            local += algo.env_runner.sample(
                seeds=chunk.tolist(), group_size=config.group_size, sampling=sampling, sample_seed=11 + index
            )
        assert [t.token_ids for t in remote] == [t.token_ids for t in local]
        np.testing.assert_allclose(
            np.concatenate([t.behaviour_logprobs for t in remote]),
            np.concatenate([t.behaviour_logprobs for t in local]),
            atol=1e-5,
        )

        # New weights after an update: one object, put once, read by every runner; Ray keeps one copy per node.
        puts = []
        real_put = ray.put
        monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(real_put(value, **kw)) or puts[-1])
        twin = [algo.train() for _ in range(2)]
        monkeypatch.undo()
        weights = [ref for ref in puts if {COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO} <= set(ray.get(ref))]
        assert len(weights) == 2  # one per update
        locations = ray.experimental.get_object_locations(weights[-1:])[weights[-1]]["node_ids"]
        assert sorted(locations) == sorted([head, *(w.node_id for w in workers)])
        twin_weights = algo.learner_group._learner.module[DEFAULT_MODULE_ID].get_state()
    finally:
        algo.stop()

    # A worker node lost mid-run: its runners are restarted on the node that replaces it (as an autoscaler would
    # bring one), the rollout is played again, and the run ends as its unkilled twin did.
    algo = config.build_algo()
    try:
        first = algo.train()
        lost = max(workers, key=lambda w: list(_runner_nodes(algo).values()).count(w.node_id))
        cluster.remove_node(lost, allow_graceful=False)
        cluster.add_node(num_cpus=2)
        second = algo.train()
        weights = algo.learner_group._learner.module[DEFAULT_MODULE_ID].get_state()
        assert lost.node_id not in _runner_nodes(algo).values()
    finally:
        algo.stop()
    assert second["env_runners"]["rollout/env_runner_restarts"] == 2
    keys = ["episode_return_mean", "rollout/num_trajectories"]
    assert [[r["env_runners"][k] for k in keys] for r in (first, second)] == [
        [r["env_runners"][k] for k in keys] for r in twin
    ]
    assert all(torch.equal(weights[k], twin_weights[k]) for k in twin_weights)
