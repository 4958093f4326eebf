"""Environment calls with a deadline: a ``reset()`` or ``step()`` that never returns must not hang the rollout.

Python cannot stop a call that is running, so each environment's calls run on a daemon worker thread of its own
and the caller waits at most ``timeout`` seconds for each. A late call's thread is left to finish (or not) on its
own, and the environment it holds is never used again (:attr:`TimedEnv.stuck`); the next call starts a fresh
worker. Daemon threads, unlike ``concurrent.futures.ThreadPoolExecutor``'s, do not keep the process alive at exit
when one is stuck.

:func:`call_each` runs one call per environment at once, so environments that hang together cost one deadline,
not one each.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import gymnasium as gym


class EnvTimeoutError(TimeoutError):
    """An environment's reset or step outlived its deadline; the episode is dropped, counted as a timeout."""


class DeadlineCaller:
    """Runs callables on one worker thread, waiting at most a deadline for each (see the module docstring)."""

    def __init__(self):
        self._jobs: queue.SimpleQueue | None = None

    @staticmethod
    def _start_worker() -> queue.SimpleQueue:
        jobs: queue.SimpleQueue = queue.SimpleQueue()

        def work():
            while True:
                fn, outcome, done = jobs.get()
                try:
                    outcome.append((True, fn()))
                except BaseException as error:  # handed to the caller, who decides
                    outcome.append((False, error))
                done.set()

        threading.Thread(target=work, name="text-env-calls", daemon=True).start()
        return jobs

    def call(self, fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """``fn()``, or :class:`EnvTimeoutError` naming ``what`` when it takes longer than ``timeout_s``."""
        if self._jobs is None:
            self._jobs = self._start_worker()
        outcome: list = []
        done = threading.Event()
        self._jobs.put((fn, outcome, done))
        if not done.wait(timeout_s):
            self._jobs = None  # the worker is stuck inside fn; the next call gets a new one
            raise EnvTimeoutError(f"{what} did not return within {timeout_s:g} s")
        returned, value = outcome[0]
        if returned:
            return value
        raise value  # the environment's own exception


def call_each(calls: Sequence[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    """Run ``calls`` at once, one thread each, and return ``(True, value)`` or ``(False, exception)`` for each, in
    order. Meant for calls into different :class:`TimedEnv` environments: each waits at most its own deadline, so
    the whole takes about the longest one. Environments must not share mutable state (as for gymnasium's vector
    environments); the adapted games' process-wide random generators are swapped under a lock
    (``envs/external.py``), so they may run here too."""

    def outcome(call):
        try:
            return True, call()
        except Exception as error:  # handed to the caller, who counts it
            return False, error

    if len(calls) <= 1:
        return [outcome(call) for call in calls]
    return list(_CALLERS.map(outcome, calls))


# Threads that only wait on the environments' own workers, at most a deadline each: kept between rollouts (a
# thread is made only when none is idle), as many as the most calls made at once.
_CALLERS = ThreadPoolExecutor(max_workers=4096, thread_name_prefix="text-env-rollout")


class TimedEnv(gym.Wrapper):
    """An environment whose ``reset`` and ``step`` each fail with :class:`EnvTimeoutError` past their deadline.

    After a timeout the wrapped environment is in an unknown state (its call may still be running), so
    :attr:`stuck` is set and the rollout engine builds a new environment in its place.
    """

    def __init__(self, env: gym.Env, reset_timeout_s: float, step_timeout_s: float):
        super().__init__(env)
        self._caller, self._reset_timeout_s, self._step_timeout_s = DeadlineCaller(), reset_timeout_s, step_timeout_s
        self.stuck = False

    def _call(self, fn: Callable[[], Any], timeout_s: float, method: str) -> Any:
        try:
            return self._caller.call(fn, timeout_s, f"{type(self.env.unwrapped).__name__}.{method}()")
        except EnvTimeoutError:
            self.stuck = True
            raise

    def reset(self, *, seed=None, options=None):
        return self._call(lambda: self.env.reset(seed=seed, options=options), self._reset_timeout_s, "reset")

    def step(self, action):
        return self._call(lambda: self.env.step(action), self._step_timeout_s, "step")
