"""What both ends of a served environment share: the protocol names, the client's error, what a reset sends besides
the observation, and the server's log of the environment's errors (both servers keep one)."""

from __future__ import annotations

import logging
import math
import threading
import traceback
from collections import Counter
from typing import Any

from ..base import TextEnv

PROTOCOLS = ("rllib_ragen", "openenv")


class RemoteEnvError(RuntimeError):
    """The remote environment could not be reached, or answered with an error."""


def episode_start(text_env: TextEnv) -> dict[str, Any]:
    """What a client needs at the start of an episode besides the observation, from the (unwrapped) environment
    just reset: both servers send it."""
    return {
        "description": text_env.describe(),
        "action_names": list(text_env.action_names),
        "action_pattern": getattr(text_env, "action_pattern", None),
        "max_turns": getattr(text_env, "max_turns", None),
        "state_key": text_env.state_key(),
        "raw_replies": bool(getattr(text_env, "raw_replies", False)),
        "tools": [dict(tool) for tool in getattr(text_env, "tools", None) or ()],
    }


class EnvironmentErrorLog:
    """The environment's errors, logged once per kind (the route and the exception's type) with a count: the first
    in full (one line, its traceback at debug level), then at the 10th, 100th, 1,000th, ... of the kind, so a client
    that repeats a bad request cannot flood the log."""

    def __init__(self, log: logging.Logger):
        self.log, self.counts, self.lock = log, Counter(), threading.Lock()

    def record(self, where: str, error: BaseException) -> None:
        kind = (where, type(error).__name__)
        with self.lock:
            self.counts[kind] += 1
            count = self.counts[kind]
        if count == 1:
            first = str(error).splitlines()[0] if str(error) else ""
            self.log.error(
                "%s: the environment raised %s: %s (repeats of this kind are counted, not logged)",
                where,
                kind[1],
                first,
            )
            self.log.debug("traceback:\n%s", traceback.format_exc())
        elif math.log10(count).is_integer():
            self.log.error("%s: the environment has raised %s %d times", where, kind[1], count)
