"""What the adapters and the HTTP environment server cost per step, against baselines measured in the same run.

- Adapter: random valid moves through ``make_text_env("gem/...")`` / ``("textarena/...")`` against the same moves
  sent to the package directly (GEM's ``\\boxed{}``, TextArena's ``[]``), resets included. The adapter adds the
  move check and the swap of the global random generators around every call.
- Server: Sokoban steps in-process against the same steps through ``rllib_ragen/Remote-v0`` and a server process on
  127.0.0.1 (one persistent connection per client), for 1 client and for 4 clients on threads.

    python benchmarks/third_party_envs.py [--seconds 2]   # needs pip install 'rllib_ragen[gem,textarena]'
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import numpy as np

from rllib_ragen.envs import make_text_env

# (adapted id, the package's own id, moves to draw from)
DIRECTIONS = ["up", "down", "left", "right"]
GEM_GAMES = [
    ("game:GuessTheNumber-v0-easy", [str(n) for n in range(1, 11)]),
    ("game:Sudoku-v0-easy", [f"{r} {c} {d}" for r in range(1, 5) for c in range(1, 5) for d in range(1, 5)]),
    ("game:Game2048-v0-easy", DIRECTIONS),
]
TEXTARENA_GAMES = [
    ("GuessTheNumber-v0-train", [str(n) for n in range(1, 21)]),
    ("2048-v0-ultra-easy-train", DIRECTIONS),
]


def rate(step, reset, seconds: float) -> float:
    """Steps per second of ``step() -> done`` over about ``seconds``, calling ``reset(seed)`` after each episode."""
    steps, seeds, start = 0, iter(range(10**9)), time.perf_counter()
    reset(next(seeds))
    while (elapsed := time.perf_counter() - start) < seconds:
        if step():
            reset(next(seeds))
        steps += 1
    return steps / elapsed


def adapter_rows(seconds: float) -> list[tuple[str, float, float]]:
    import gem
    import textarena

    rows = []
    for game_id, moves in GEM_GAMES:
        rng, direct = np.random.default_rng(0), gem.make(game_id)
        alone = rate(
            lambda: direct.step("\\boxed{" + str(rng.choice(moves)) + "}")[2],
            lambda seed: direct.reset(seed=seed),
            seconds,
        )
        rng, adapted = np.random.default_rng(0), make_text_env("gem/" + game_id.replace(":", ".", 1))
        through = rate(lambda: adapted.step(str(rng.choice(moves)))[2], lambda seed: adapted.reset(seed=seed), seconds)
        rows.append((f"gem/{game_id}", alone, through))
    for game_id, moves in TEXTARENA_GAMES:
        rng, direct = np.random.default_rng(0), textarena.make(game_id)

        def step_direct():
            done, _ = direct.step(f"[{rng.choice(moves)}]")
            direct.get_observation()
            if done:
                direct.close()
            return done

        alone = rate(
            step_direct, lambda seed: (direct.reset(num_players=1, seed=seed), direct.get_observation()), seconds
        )
        rng, adapted = np.random.default_rng(0), make_text_env("textarena/" + game_id)
        through = rate(lambda: adapted.step(str(rng.choice(moves)))[2], lambda seed: adapted.reset(seed=seed), seconds)
        rows.append((f"textarena/{game_id}", alone, through))
    return rows


def served_rate(url: str, clients: int, seconds: float) -> float:
    """Steps per second summed over ``clients`` threads, each playing Sokoban through its own Remote-v0."""
    counts = [0.0] * clients

    def client(i):
        env, rng = make_text_env("rllib_ragen/Remote-v0", url=url), np.random.default_rng(i)
        moves = ["Up", "Down", "Left", "Right"]
        counts[i] = rate(lambda: any(env.step(str(rng.choice(moves)))[2:4]), lambda seed: env.reset(seed=seed), seconds)
        env.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    args = parser.parse_args()

    print("Adapter against the package alone (random moves, resets included)")
    print(f"  {'game':40s} {'package':>10s} {'adapter':>10s}   ratio   adapter cost")
    for name, alone, through in adapter_rows(args.seconds):
        cost_us = (1 / through - 1 / alone) * 1e6
        print(f"  {name:40s} {alone:8.0f}/s {through:8.0f}/s   {through / alone:.2f}x  {cost_us:+7.1f} us/step")

    print("Sokoban in-process against the same environment served over HTTP on 127.0.0.1")
    env, rng = make_text_env("rllib_ragen/Sokoban-v0"), np.random.default_rng(0)
    moves = ["Up", "Down", "Left", "Right"]
    local = rate(lambda: any(env.step(str(rng.choice(moves)))[2:4]), lambda seed: env.reset(seed=seed), args.seconds)
    print(f"  {'in-process (baseline)':40s} {local:8.0f}/s")
    server = subprocess.Popen(
        [sys.executable, "-m", "rllib_ragen.envs.remote.server", "--env", "rllib_ragen/Sokoban-v0", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = server.stdout.readline().split(" on ")[1].strip()
        for clients in (1, 4):
            served = served_rate(url, clients, args.seconds)
            print(
                f"  {f'served, {clients} client(s)':40s} {served:8.0f}/s   {served / local:.3f}x baseline   "
                f"{1e6 / served * clients:8.0f} us/step per client"
            )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
