"""Our remote protocol against OpenEnv's, the same environment served both ways on 127.0.0.1: speed on a clean
connection, and what each keeps of an episode when connections drop.

Each protocol's server runs as ``python -m rllib_ragen.envs.remote.server --env rllib_ragen/Sokoban-v0`` (with
``--protocol openenv`` for OpenEnv's, OpenEnv's own FastAPI app and WebSocket sessions) and is played by the
package's client of that protocol (``rllib_ragen/Remote-v0``), random moves from fixed seeds:

- clean: environment steps per second, resets included, one client;
- dropped answers: the same episodes through a TCP proxy that closes the connection instead of passing on every
  ``--drop-every``-th chunk the server sends (an answer the server computed and the client never got). Each episode
  either completes or ends with the client's error; a completed one is replayed in-process from its seed and moves,
  and any observation that differs is counted: a step taken twice or lost.

    python benchmarks/remote_protocols.py [--episodes 200] [--drop-every 25] [--seconds 3]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from rllib_ragen.envs import make_text_env
from rllib_ragen.envs.remote import RemoteEnvError, remote_text_env

ENV = "rllib_ragen/Sokoban-v0"
MOVES = ("Up", "Down", "Left", "Right")
MAX_MOVES = 10


def serve(protocol: str) -> tuple[subprocess.Popen, str]:
    """A server of ``protocol`` on a free port, and its URL."""
    command = [sys.executable, "-m", "rllib_ragen.envs.remote.server", "--env", ENV, "--port", "0"]
    if protocol == "openenv":
        command += ["--protocol", "openenv"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = server.stdout.readline()
    if " on " not in line:
        server.kill()
        raise SystemExit(f"the {protocol} server did not start: {line!r}")
    return server, line.split(" on ")[1].split()[0]


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``url``'s port that, every ``drop_every``-th chunk the server sends
    (counted over every connection), closes both sides of that connection instead of passing the chunk on."""

    def __init__(self, url: str, drop_every: int):
        host, port = url.split("//")[1].split(":")
        self.upstream, self.drop_every, self.chunks, self.dropped = (host, int(port)), drop_every, 0, 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_server: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if from_server:
                    with self.lock:
                        self.chunks += 1
                        drop = self.chunks % self.drop_every == 0
                        self.dropped += drop
                    if drop:
                        break
                target.sendall(chunk)
        except OSError:
            pass
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()


def play(env, seed: int, rng: np.random.Generator) -> tuple[list[str], list[str]]:
    """One episode of random moves: the moves and every observation (the reset's first)."""
    observation, _ = env.reset(seed=seed)
    moves, observations = [], [observation]
    for _ in range(MAX_MOVES):
        move = str(rng.choice(MOVES))
        observation, _, terminated, truncated, _ = env.step(move)
        moves.append(move)
        observations.append(observation)
        if terminated or truncated:
            break
    return moves, observations


def replayed(seed: int, moves: list[str]) -> list[str]:
    """The observations of ``moves`` from ``seed`` in this process."""
    env = make_text_env(ENV)
    observations = [env.reset(seed=seed)[0]]
    observations += [env.step(move)[0] for move in moves]
    return observations


def clean_rate(url: str, protocol: str, seconds: float) -> float:
    """Environment steps per second through one client, resets included."""
    env, rng = remote_text_env(url, protocol=protocol), np.random.default_rng(0)
    steps, seed, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += len(play(env, seed, rng)[0])
        seed += 1
    env.close()
    return steps / (time.perf_counter() - start)


def through_drops(url: str, protocol: str, episodes: int, drop_every: int) -> dict:
    """Play ``episodes`` episodes through a :class:`DroppingProxy`: how many completed, ended with an error, or
    completed with observations that differ from an in-process replay."""
    proxy = DroppingProxy(url, drop_every)
    env, rng = remote_text_env(proxy.url, protocol=protocol, retry_backoff_s=0.01), np.random.default_rng(1)
    completed = errors = diverged = 0
    for seed in range(episodes):
        try:
            moves, observations = play(env, seed, rng)
        except RemoteEnvError:
            errors += 1
            env.close()
            env = remote_text_env(proxy.url, protocol=protocol, retry_backoff_s=0.01)
            continue
        completed += 1
        diverged += observations != replayed(seed, moves)
    env.close()
    proxy.close()
    return {"completed": completed, "errors": errors, "diverged": diverged, "dropped": proxy.dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes through the dropping proxy")
    parser.add_argument("--drop-every", type=int, default=25, help="drop every k-th chunk the server sends")
    parser.add_argument("--seconds", type=float, default=3.0, help="time of the clean-connection measurement")
    args = parser.parse_args()
    print(f"{ENV} served on 127.0.0.1, random moves (at most {MAX_MOVES} an episode)")
    print(
        f"  {'protocol':12s} {'clean steps/s':>14s}   through drops (every {args.drop_every}th server chunk): "
        "completed / errors / diverged of episodes, answers dropped"
    )
    for protocol in ("rllib_ragen", "openenv"):
        server, url = serve(protocol)
        try:
            rate = clean_rate(url, protocol, args.seconds)
            dropped = through_drops(url, protocol, args.episodes, args.drop_every)
        finally:
            server.terminate()
            server.wait(timeout=10)
        print(
            f"  {protocol:12s} {rate:12.0f}/s   {dropped['completed']:4d} / {dropped['errors']:4d} / "
            f"{dropped['diverged']:4d} of {args.episodes}, {dropped['dropped']} dropped"
        )


if __name__ == "__main__":
    main()
