"""The main jobs' layer: a job's own settings (``settings.py``) and a job file's flags (``flags.py``), its run as a Tune
experiment (``run.py``), what the trials write while they train (``callbacks.py``, ``outputs.py``, into the
whole-or-absent storage of ``storage.py``), what the console shows meanwhile (``console.py``: the plan, the progress
lines, library notices kept off it), the report built from the finished folders (``report.py``, reading them through
``readers.py``, with ``paired_stats.py``, ``validation_states.py``, the learning curve of ``curves.py`` and the
rollout viewer, ``viewer.py``), and the warm-start step before them (``warm_start.py``: demonstrations played and
learnt with :mod:`rllib_ragen.warm_start`, then cached). It plays no RL rollout of its own: every RL episode goes
through StarPO (``tests/test_layers.py``).

A job file needs three names::

    from rllib_ragen.jobs import JobSettings, parse_job_args, run_job
"""

from .flags import parse_job_args
from .settings import JobSettings
from .run import run_job

__all__ = ["JobSettings", "parse_job_args", "run_job"]
