"""The main jobs' layer: a job file's flags (``flags.py``), its run as a Tune experiment (``run.py``), what the
trials write while they train (``callbacks.py``, ``outputs.py``, into the whole-or-absent storage of ``storage.py``),
and the report built from the finished folders (``report.py``, with ``paired_stats.py``, ``validation_states.py`` and
the rollout viewer, ``viewer.py``). It plays no rollout of its own: every episode goes through StarPO
(``tests/test_layers.py``).

A job file needs three names::

    from rllib_ragen.jobs import JobSettings, parse_job_args, run_job
"""

__all__ = ["JobSettings", "parse_job_args", "run_job"]


def __getattr__(name):
    # Imported when asked for: the warm start (rllib_ragen.warm_start) imports this package's outputs, and run.py it.
    if name in __all__:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module 'rllib_ragen.jobs' has no attribute {name!r}")
