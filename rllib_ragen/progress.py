"""Progress of the long steps a user waits on (a warm start, its demonstrations, playing validation states): a tqdm
bar on a terminal; elsewhere (a job's log, CI, a pipe) a plain line at most every ``every_s`` seconds and at the
end, so that a log shows the work moving without a bar's carriage returns."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

PLAIN_LINE_EVERY_S = 10.0  # off a terminal: a line this often while the work moves (at an update)
QUIET_LIMIT_S = 15.0  # ... and sooner where waiting one more step (as long as the last) would leave a longer silence
PLAIN_FORMAT = "{desc}: {n_fmt}/{total_fmt} %s [{elapsed}<{remaining}, {rate_fmt}{postfix}]"  # the unit's plural


class Progress:
    """``with Progress(total, "warm start", "steps") as progress: ... progress.update(done, loss=0.4)``."""

    def __init__(
        self, total: int, description: str, unit: str, stream: TextIO | None = None, every_s: float = PLAIN_LINE_EVERY_S
    ):
        self.total, self.description, self.unit = total, description, unit
        self.stream = stream or sys.stdout
        self.every_s, self.done, self.postfix, self.printed = every_s, 0, "", None
        self.start = self.last_line = self.last_update = time.perf_counter()
        terminal = getattr(self.stream, "isatty", lambda: False)()
        self.bar = (
            tqdm(total=total, desc=description, unit=unit.rstrip("s"), file=self.stream, dynamic_ncols=True)
            if terminal
            else None
        )

    def update(self, done: int, **postfix: float | str) -> None:
        """``done`` of ``total`` finished (a count, not an increment); ``postfix``: figures to show beside it."""
        self.postfix = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in postfix.items())
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            if postfix:
                self.bar.set_postfix_str(self.postfix)
        self.done = done
        now = time.perf_counter()
        step_s, self.last_update = now - self.last_update, now
        quiet_s = now - self.last_line
        if self.bar is None and done < self.total and (quiet_s >= self.every_s or quiet_s + step_s > QUIET_LIMIT_S):
            self._line(now)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.printed != self.done:
            self._line(time.perf_counter())

    def _line(self, now: float) -> None:
        self.last_line, self.printed = now, self.done
        text = tqdm.format_meter(
            self.done,
            self.total,
            now - self.start,
            prefix=self.description,
            unit=self.unit.rstrip("s"),
            bar_format=PLAIN_FORMAT % self.unit,
            postfix=self.postfix or None,
        )
        print(text, file=self.stream, flush=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
