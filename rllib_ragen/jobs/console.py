"""The quiet console of a main job: library and framework notices go to the run's ``job.log``, not the terminal.

Held in memory until the run folder exists (:func:`send_notices_to`), and routed away from it once the run ends
(:func:`close_run_log`); errors still reach the console.
"""

from __future__ import annotations

import logging
import logging.handlers
import pathlib
import sys

NOISY_LOGGERS = ("ray", "ray.rllib", "transformers", "huggingface_hub", "torch", "accelerate", "py.warnings")

# Notices raised before the run folder exists (RLlib's API-stack notice comes at config validation) wait here.
_EARLY_NOTICES = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)

_run_log: logging.Handler | None = None  # the current run's job.log

def keep_notices_off_the_console() -> None:
    """Library and framework notices (RLlib's API-stack notice and deprecations, "Install gputil", Python
    warnings, transformers' loading bars) stay off the console; errors still reach it. Until
    :func:`send_notices_to` names a run's log file they are held in memory. Safe to call again (Ray re-creates
    its console handler at ``ray.init``)."""
    # Imported first: transformers adds its console handler when its logging module first loads.
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    logging.captureWarnings(True)
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.ERROR)  # the console handlers (Ray's own is a subclass)
        if _run_log not in logger.handlers and _EARLY_NOTICES not in logger.handlers:
            logger.addHandler(_EARLY_NOTICES)
        if not name.startswith("ray"):  # Ray's loggers do not propagate already
            logger.propagate = False  # the root logger's console handler would print them anyway
    hf_logging.disable_progress_bar()  # "Loading weights" bars
    disable_progress_bars()  # "Writing model shards" bars

def send_notices_to(log_file: pathlib.Path) -> None:
    """Write the held notices, and every later one, to ``log_file`` (until :func:`close_run_log`)."""
    global _run_log
    close_run_log()
    _run_log = _RunLog(log_file)
    _run_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    _EARLY_NOTICES.setTarget(_run_log)
    _EARLY_NOTICES.flush()
    _EARLY_NOTICES.setTarget(None)
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if _EARLY_NOTICES in logger.handlers:
            logger.removeHandler(_EARLY_NOTICES)
            logger.addHandler(_run_log)

def close_run_log() -> None:
    """Stop writing to the run's log file: notices after a run must not land in its folder."""
    global _run_log
    if _run_log is None:
        return
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if _run_log in logger.handlers:
            logger.removeHandler(_run_log)
            logger.addHandler(_EARLY_NOTICES)
    try:
        _run_log.close()
    except OSError as error:  # its last notices could not be written (a full disk): said once, never raised over
        _run_log.report(error)  # the job's own error, which must be the job's last words
    _run_log = None

class _RunLog(logging.FileHandler):
    """The run's ``job.log``. A notice it cannot write (a full disk) is reported once on stderr, and the rest go
    nowhere, instead of logging's traceback for every notice burying the job's own last words."""

    failed = False

    def handleError(self, record) -> None:
        self.report(sys.exc_info()[1])

    def report(self, error) -> None:
        if not self.failed:
            self.failed = True
            print(f"{self.baseFilename}: notices from here on could not be written ({error})", file=sys.stderr,
                  flush=True)

