"""parse_reply on hostile 1 MB replies, against the backtracking regex parser it replaced (same run, same inputs
at a size that parser finishes in seconds).

    python benchmarks/parser.py
"""

from __future__ import annotations

import re
import time

from rllib_ragen.rollout import parse_reply

# The previous parser's grammar: fullmatch of lazy groups, which backtracks over repeated tags.
_OLD = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.IGNORECASE | re.DOTALL)


def hostile(size: int) -> dict[str, str]:
    unit = "</think><answer>"
    return {
        "repeated close/open tags": "<think>" + unit * (size // len(unit)),
        "repeated open tags": "<think>" * (size // 7),
        "unclosed answer": "<think>x</think><answer>" + "Up || " * (size // 6),
        "well-formed, long answer": "<think>x</think><answer>" + "Up || " * (size // 6) + "</answer>",
    }


def best_of(fn, text: str, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    megabyte, baseline_size = 1_000_000, 16_000
    print(f"{'input':28s}{'parse_reply 1 MB':>18s}{'old parser 16 KB':>18s}{'new 16 KB':>12s}{'old/new @16KB':>15s}")
    for name, text in hostile(megabyte).items():
        new_mb = best_of(parse_reply, text)
        small = hostile(baseline_size)[name]
        old_small, new_small = best_of(_OLD.fullmatch, small, 1), best_of(parse_reply, small)
        print(
            f"{name:28s}{new_mb * 1e3:15.1f} ms{old_small * 1e3:15.1f} ms{new_small * 1e3:9.2f} ms"
            f"{old_small / new_small:14.0f}x"
        )
    print("target: any 1 MB input under 50 ms")


if __name__ == "__main__":
    main()
