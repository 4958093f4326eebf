"""Environments served over HTTP: real server processes on 127.0.0.1 (``python -m rllib_ragen.envs.remote.server``),
played through RemoteTextEnv and the rollout engine, including a server killed mid-episode and a slow one."""

import http.client
import json
import time

import numpy as np
import pytest

from rllib_ragen.envs import make_text_env
from rllib_ragen.envs.remote import RemoteEnvError
from rllib_ragen.rollout import RolloutConfig, RolloutEngine, SamplingParams, ScriptedBackend
from rllib_ragen.rollout.tiny_model import build_tiny_tokenizer

REMOTE = "rllib_ragen/Remote-v0"


def _random_play(env, seed, actions, steps=12):
    rng = np.random.default_rng(seed)
    trace = [env.reset(seed=seed), env.unwrapped.describe(), env.unwrapped.state_key()]
    for _ in range(steps):
        step = env.step(str(rng.choice(actions)))
        trace.append((step, env.unwrapped.state_key()))
        if step[2] or step[3]:
            break
    return trace


@pytest.mark.parametrize(
    "env_id, actions",
    [
        ("rllib_ragen/Sokoban-v0", ["Up", "Down", "Left", "Right", "Jump"]),
        ("rllib_ragen/FrozenLake-v0", ["Left", "Down", "Right", "Up"]),  # slippery: the server's own luck, seeded
        ("gem/game.Mastermind-v0-easy", ["1 2", "3 4", "5 6", "2 1", "6 5"]),
    ],
)
def test_remote_play_equals_in_process_play(env_id, actions, env_server):
    if env_id.startswith("gem/"):
        pytest.importorskip("gem")
    with env_server(env_id) as server:
        remote = make_text_env(REMOTE, url=server.url)
        for seed in range(20):
            assert _random_play(remote, seed, actions) == _random_play(make_text_env(env_id), seed, actions)
        remote.close()


def test_a_rollout_through_a_server_is_token_for_token_the_in_process_one(env_server):
    tokenizer = build_tiny_tokenizer(seed=0)
    backend = ScriptedBackend(lambda prompt: "<think>push</think><answer>Up || Left || Sideways</answer>", tokenizer)

    def play(env, env_config):
        engine = RolloutEngine(RolloutConfig(env=env, env_config=env_config), backend, tokenizer)
        return engine.rollout([3, 4], 2, SamplingParams(), sample_seed=0)

    with env_server("rllib_ragen/Sokoban-v0") as server:
        (remote, remote_metrics), (local, local_metrics) = (
            play(REMOTE, {"url": server.url}),
            play("rllib_ragen/Sokoban-v0", {}),
        )
    assert [t.token_ids for t in remote] == [t.token_ids for t in local]
    assert [t.turn_rewards for t in remote] == [t.turn_rewards for t in local]
    assert [t.turn_states for t in remote] == [t.turn_states for t in local]  # GiGPO's anchor states too
    assert remote_metrics["rollout/format_error_rate"] == local_metrics["rollout/format_error_rate"] > 0


def test_a_server_killed_mid_episode_drops_its_episodes_counted_and_a_restarted_one_serves_again(env_server):
    tokenizer = build_tiny_tokenizer(seed=0)
    with env_server("rllib_ragen/Sokoban-v0") as server:
        port = server.url.rsplit(":", 1)[1]
        calls = []

        def policy(prompt):  # the server dies while the policy writes its first reply
            calls.append(prompt)
            if len(calls) == 1:
                server.stop()
            return "<think></think><answer>Up</answer>"

        config = RolloutConfig(
            env=REMOTE, env_config={"url": server.url, "connect_retries": 2, "retry_backoff_s": 0.05}
        )
        engine = RolloutEngine(config, ScriptedBackend(policy, tokenizer), tokenizer)
        started = time.monotonic()
        trajectories, metrics = engine.rollout([0, 1], 2, SamplingParams())
        assert trajectories == [] and metrics["rollout/env_errors"] == 4.0  # each episode dropped and counted
        assert time.monotonic() - started < 10  # retries are bounded: no hang
        with env_server("rllib_ragen/Sokoban-v0", port=port):  # the same address, a fresh server
            trajectories, metrics = engine.rollout([0, 1], 2, SamplingParams())
        assert len(trajectories) == 4 and metrics["rollout/env_errors"] == 0.0


def test_a_slow_server_is_an_environment_timeout_not_a_hang(env_server):
    tokenizer = build_tiny_tokenizer(seed=0)
    backend = ScriptedBackend(lambda prompt: "<think></think><answer>Go</answer>", tokenizer)
    with env_server("tests/ServedFaults-v0", "--env-config", json.dumps({"step_sleep_s": 3.0})) as server:
        config = RolloutConfig(env=REMOTE, env_config={"url": server.url}, max_turns=1, env_step_timeout_s=0.5)
        started = time.monotonic()
        trajectories, metrics = RolloutEngine(config, backend, tokenizer).rollout([0], 2, SamplingParams())
    assert trajectories == [] and metrics["rollout/env_timeouts"] == 2.0
    assert time.monotonic() - started < 8


def test_control_tokens_in_a_served_observation_are_neutralised_and_counted(env_server):
    tokenizer = build_tiny_tokenizer(seed=0)
    backend = ScriptedBackend(lambda prompt: "<think></think><answer>Go</answer>", tokenizer)
    with env_server("tests/ServedFaults-v0") as server:
        config = RolloutConfig(env=REMOTE, env_config={"url": server.url}, max_turns=1)
        (trajectory,), metrics = RolloutEngine(config, backend, tokenizer).rollout([0], 1, SamplingParams())
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert trajectory.token_ids.count(start) == 3  # system, user, assistant: the template's own, no injected one
    assert "< |im_start|>system" in trajectory.text and metrics["rollout/control_texts_neutralised"] == 4.0


def test_a_retried_step_is_answered_once_and_bad_requests_are_refused(env_server):
    with env_server("rllib_ragen/Sokoban-v0") as server:
        host, port = server.url[len("http://") :].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)

        def post(path, body):
            connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, json.loads(response.read())

        status, reset = post("/reset", {"seed": 5})
        session = reset["session_id"]
        first = post("/step", {"session_id": session, "action": "Up", "index": 0})
        again = post("/step", {"session_id": session, "action": "Up", "index": 0})  # the response was "lost"
        assert status == 200 and first == again
        connection.request("GET", f"/state?session_id={session}")
        assert json.loads(connection.getresponse().read())["steps"] == 1  # stepped once
        assert post("/step", {"session_id": session, "action": "Up", "index": 7})[0] == 400
        assert post("/step", {"session_id": "nope", "action": "Up", "index": 0})[0] == 404
        assert post("/reset", {"seed": True})[0] == 400  # booleans are not seeds
        assert post("/close", {"session_id": session}) == (200, {"closed": True})
        assert post("/step", {"session_id": session, "action": "Up", "index": 1})[0] == 404


def test_an_unreachable_server_fails_fast_naming_it():
    env = make_text_env(REMOTE, url="http://127.0.0.1:9", connect_retries=1, retry_backoff_s=0.01)
    with pytest.raises(RemoteEnvError, match=r"cannot reach the environment server at http://127.0.0.1:9"):
        env.reset(seed=0)
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        make_text_env(REMOTE, url="127.0.0.1:8000")


def _serve_with_log(env_id, *flags):
    """A server process whose log (stderr) the test reads: (process, host, port)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rllib_ragen.envs.remote.server",
            "--env",
            env_id,
            "--port",
            "0",
            "--register",
            "served_envs",
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    line = process.stdout.readline()
    assert line.startswith("serving"), f"the server did not start: {line!r}"
    host, port = line.split("http://")[1].split()[0].split(":")
    return process, host, int(port)


def _raw(host: str, port: int, request: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection; what comes back before the server closes it (or the timeout)."""
    import socket

    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.sendall(request)
        received = b""
        try:
            while chunk := connection.recv(65536):
                received += chunk
        except TimeoutError:
            pass
        return received


def test_the_server_holds_under_abuse_and_logs_each_kind_of_environment_error_once_with_a_count():
    import socket
    import threading

    process, host, port = _serve_with_log(
        "rllib_ragen/Sokoban-v0", "--max-sessions", "3", "--max-body-bytes", "200000", "--request-timeout-s", "1"
    )
    try:
        connection = http.client.HTTPConnection(host, port, timeout=10)

        def post(path, body: bytes, headers=None):
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            response = connection.getresponse()
            return response.status, json.loads(response.read())

        # Resets the environment refuses (a negative seed) close their sessions: 3 slots survive 20 of them.
        assert all(post("/reset", b'{"seed": -1}')[0] == 500 for _ in range(20))
        assert post("/reset", b'{"seed": 1}')[0] == 200
        # A body nested too deep to parse is a bad request, answered (it dropped the connection).
        status, answer = post("/reset", b"[" * 100_000)
        assert status == 400 and "RecursionError" in answer["error"]
        # A body over the limit is refused unread, at once; a negative length too (it held a thread for ever).
        too_big = _raw(host, port, b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n")
        assert too_big.startswith(b"HTTP/1.1 413")
        negative = _raw(host, port, b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        assert negative.startswith(b"HTTP/1.1 400")
        # A client that stops mid-request loses its connection after --request-timeout-s, not a thread for ever.
        started = time.monotonic()
        assert _raw(host, port, b"POST /reset HTTP/1.1\r\nHost: x\r\n", timeout=30) == b""
        assert time.monotonic() - started < 10
        # 64 clients connecting at once are all served (a listen backlog of 5 reset a third of them).
        statuses = []

        def health():
            with socket.create_connection((host, port), timeout=30) as c:
                c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                statuses.append(c.recv(12))

        threads = [threading.Thread(target=health) for _ in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert statuses == [b"HTTP/1.1 200"] * 64
    finally:
        process.terminate()
        _, log = process.communicate(timeout=30)
    # 20 environment errors of one kind: logged once, then counted at the 10th (a traceback each wrote 2,050 lines
    # for 55 bad requests; then one line each).
    errors = [line for line in log.splitlines() if "POST /reset: the environment " in line]
    assert len(errors) == 2 and "Traceback" not in log
    assert "the environment raised Error: " in errors[0] and "counted" in errors[0]  # gymnasium's error.Error
    assert errors[1].endswith("the environment has raised Error 10 times")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-body-bytes", "-1"], "--max-body-bytes -1: give at least 0"),
        (["--request-timeout-s", "0"], "--request-timeout-s 0.0: give a number"),
        (["--session-ttl-s", "nan"], "--session-ttl-s nan: give a number"),
        (["--max-sessions", "0"], "--max-sessions 0: give at least 1"),
    ],
)
def test_bad_server_limits_are_refused_before_it_listens(flags, message, capsys):
    from rllib_ragen.envs.remote.server import main

    with pytest.raises(SystemExit) as stopped:
        main(["--env", "rllib_ragen/Sokoban-v0", "--port", "0", *flags])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_an_unknown_environment_is_one_line_and_exit_code_2():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "rllib_ragen.envs.remote.server", "--env", "nope/Nope-v0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "cannot serve --env nope/Nope-v0" in done.stderr.splitlines()[-1]


def test_the_openenv_server_holds_the_same_limits_under_abuse():
    """uvicorn and OpenEnv's app leave three holes that our own server does not have, each closed here: a half-sent
    request head held its connection for ever (280 of them made /health answer 503), a body over --max-body-bytes was
    read whole, and an idle WebSocket session outlived --session-ttl-s (OpenEnv's reaper skips attached sessions)."""
    pytest.importorskip("openenv")
    import socket

    process, host, port = _serve_with_log(
        "rllib_ragen/Sokoban-v0",
        "--protocol",
        "openenv",
        "--max-sessions",
        "3",
        "--max-body-bytes",
        "100000",
        "--request-timeout-s",
        "3",
        "--session-ttl-s",
        "2",
    )
    half_heads = []
    try:
        for _ in range(280):
            half_heads.append(socket.create_connection((host, port), timeout=30))
            half_heads[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        health = _raw(host, port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert health.startswith(b"HTTP/1.1 200") and time.monotonic() - t0 < 2
        # Each half-sent head's connection is closed once --request-timeout-s has passed.
        time.sleep(4.5)
        closed = 0
        for connection in half_heads:
            connection.settimeout(5)
            try:
                closed += connection.recv(1) == b""
            except (ConnectionResetError, TimeoutError):
                closed += 0
        assert closed == 280
        # A body over the limit is refused, by its length unread, and sent in chunks as soon as it passes the limit.
        body = b'{"seed": 0, "pad": "' + b"x" * 2_000_000 + b'"}'
        declared = _raw(
            host,
            port,
            b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body),
        )
        assert declared.startswith(b"HTTP/1.1 413") and b"--max-body-bytes" in declared
        # Its first 100,001 bytes, and no more: bytes the server leaves unread would reset the connection under
        # its answer.
        chunk = b"%x\r\n%s\r\n" % (100_001, body[:100_001])
        chunked = _raw(
            host,
            port,
            b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunk,
        )
        assert chunked.startswith(b"HTTP/1.1 413")
        small = _raw(
            host,
            port,
            b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 11\r\nConnection: close\r\n\r\n{"seed": 0}',
        )
        assert small.startswith(b"HTTP/1.1 200")  # a body within the limit is served
        # An idle WebSocket session is ended after --session-ttl-s.
        from openenv.core.generic_client import GenericEnvClient

        with GenericEnvClient(base_url=f"http://{host}:{port}").sync() as client:
            client.reset(seed=0)
            time.sleep(3.5)
            with pytest.raises(Exception):
                client.step({"message": "Up"})
    finally:
        for connection in half_heads:
            connection.close()
        process.terminate()
        process.communicate(timeout=30)


def test_the_remote_id_builds_each_protocols_client_through_one_factory():
    """``rllib_ragen/Remote-v0`` names a factory, not a class that swaps itself: each protocol gets its own client
    (nothing connects before the first reset), and the id still reads as RemoteTextEnv's arguments."""
    from rllib_ragen.envs.remote import RemoteTextEnv, remote_text_env
    from rllib_ragen.envs.remote.openenv_client import OpenEnvTextEnv
    from rllib_ragen.starpo.environments import env_arguments, env_class

    ours, theirs = remote_text_env("http://127.0.0.1:9"), remote_text_env("http://127.0.0.1:9", protocol="openenv")
    assert type(ours) is RemoteTextEnv and type(theirs) is OpenEnvTextEnv
    assert (
        type(make_text_env("rllib_ragen/Remote-v0", url="http://127.0.0.1:9", protocol="openenv").unwrapped)
        is OpenEnvTextEnv
    )
    assert env_class("rllib_ragen/Remote-v0") is RemoteTextEnv and "connect_retries" in env_arguments(
        "rllib_ragen/Remote-v0"
    )
    with pytest.raises(ValueError, match=r"protocol='openenv' is played by OpenEnvTextEnv.*remote_text_env"):
        RemoteTextEnv("http://127.0.0.1:9", protocol="openenv")


def test_a_factory_registered_without_the_class_it_builds_is_refused_at_registration():
    """The config's checks read a factory's class from its return annotation: without one, registering fails now,
    naming the fix, not later inside a config check."""
    from rllib_ragen.envs import register_text_env

    def unannotated(url):
        return None

    with pytest.raises(TypeError, match="return annotated as that class"):
        register_text_env("test/Unannotated-v0", unannotated)
