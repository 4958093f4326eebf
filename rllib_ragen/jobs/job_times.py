"""How long each main job takes: one table, the only source of the times the jobs, the README and the docs state.

Each figure is the wall time of one run of the command as written, from the command to its exit, its warm start
trained (not taken from the cache), nothing else running, as ``python benchmarks/main_jobs.py`` measures it. What
moves a job's time most from one CPU to another is whether it computes bfloat16 natively, so each command has a
figure per kind of CPU it was timed on; the plan line states the one for the CPU it runs on, or says that this kind
was not timed. ``tests/jobs/test_job_times.py`` keeps the README and the docs equal to this table (the tuned examples'
docstrings point at it and quote no figure), and the Main jobs page prints it whole (:func:`job_times_table`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CPU_KINDS", "JOB_TIMES", "CpuKind", "JobTime", "job_time", "job_times_table", "this_cpu", "timing_sentence"]


@dataclass(frozen=True)
class CpuKind:
    label: str  # as the docs and the plan line name it
    bfloat16_native: bool  # AVX512-BF16 or AMX (rllib_ragen.hardware.cpu_computes_bfloat16)
    amx: bool = False  # Intel's matrix units: a Xeon with them ran SmolLM2's bfloat16 warm start 1.8x an EPYC without


XEON_BF16 = CpuKind("2-core Intel Xeon with native bfloat16 (AVX512-BF16, AMX)", True, amx=True)
EPYC_BF16 = CpuKind("2-core AMD EPYC with native bfloat16 (AVX512-BF16, no AMX)", True)
AVX2 = CpuKind("2-core x86 CPU with AVX2 (bfloat16 emulated)", False)
CPU_KINDS = (XEON_BF16, EPYC_BF16, AVX2)


@dataclass(frozen=True)
class JobTime:
    minutes: float
    cpu: CpuKind
    measured: str  # the date of the run (ISO)


# Command (as run from the repository root, after ``python tuned_examples/``) -> its times, one per CPU kind timed.
JOB_TIMES: dict[str, tuple[JobTime, ...]] = {
    "starpo_bandit.py": (JobTime(1.2, XEON_BF16, "2026-12-06"), JobTime(2.5, AVX2, "2026-11-28")),
    "starpo_bandit.py --quick": (JobTime(0.5, XEON_BF16, "2026-12-06"),),
    "starpo_sokoban.py": (JobTime(21.5, AVX2, "2026-11-28"),),
    "starpo_sokoban.py --quick": (JobTime(1.0, XEON_BF16, "2026-12-06"),),
    "starpo_sokoban.py --preset smollm2-cpu --quick": (JobTime(8.9, XEON_BF16, "2026-12-06"),),
    "starpo_frozenlake.py": (JobTime(36.9, AVX2, "2026-11-28"),),
    "starpo_frozenlake.py --quick": (JobTime(2.0, XEON_BF16, "2026-12-06"),),
    # Since 2026-12-07 the preset runs 40 iterations, not 30 minutes (the preset before took 43.5 min on the Xeon).
    "starpo_frozenlake.py --preset smollm2-cpu": (JobTime(61.1, EPYC_BF16, "2026-12-07"),),
    "starpo_frozenlake.py --preset smollm2-cpu --quick": (JobTime(11.1, XEON_BF16, "2026-12-06"),),
    "starpo_gem.py": (JobTime(40.6, AVX2, "2026-11-28"),),
    "starpo_selfplay.py": (JobTime(13.5, EPYC_BF16, "2026-12-06"),),
    "starpo_selfplay.py --game kuhn-poker": (JobTime(6.9, EPYC_BF16, "2026-12-07"),),
    "starpo_tools.py": (JobTime(19.0, AVX2, "2026-11-28"),),
    "tune_sokoban.py": (JobTime(19.4, AVX2, "2026-11-28"),),
    "generalization.py": (JobTime(44.8, AVX2, "2026-11-28"),),
    "echo_trap.py": (JobTime(4.7, AVX2, "2026-11-28"),),
    "echo_trap.py --lr 1.5e-3 --iterations 25": (JobTime(5.5, AVX2, "2026-11-28"),),
    "estimator_study.py": (JobTime(44.2, AVX2, "2026-11-29"),),
    "filter_study.py": (JobTime(28.3, AVX2, "2026-11-29"),),
}


def this_cpu() -> tuple[bool, bool]:
    """This CPU's (native bfloat16, AMX), as :func:`job_time` takes them."""
    import torch

    from ..hardware import cpu_computes_bfloat16

    return cpu_computes_bfloat16(), bool(torch.cpu._is_amx_tile_supported())


def job_time(command: str, bfloat16_native: bool, amx: bool = False) -> tuple[JobTime | None, JobTime | None]:
    """``command``'s time on a CPU of this kind (its bfloat16 and AMX alike; None: not timed on one), and, where that
    is None, its time on the nearest kind timed: one that also computes bfloat16 natively or not, else any (None:
    never timed)."""
    times = JOB_TIMES.get(command, ())
    here = next((t for t in times if (t.cpu.bfloat16_native, t.cpu.amx) == (bfloat16_native, amx)), None)
    nearest = next((t for t in times if t.cpu.bfloat16_native == bfloat16_native), next(iter(times), None))
    return here, (None if here else nearest)


def timing_sentence(command: str, bfloat16_native: bool, amx: bool = False) -> str:
    """What the plan line says of ``command``'s time on this CPU ("" when it was never timed)."""
    here, elsewhere = job_time(command, bfloat16_native, amx)
    if here:
        return f"{command} took {here.minutes:g} min on a {here.cpu.label}, a CPU of this kind"
    if elsewhere:
        if elsewhere.cpu.bfloat16_native == bfloat16_native:
            label = elsewhere.cpu.label
            return f"{command} took {elsewhere.minutes:g} min on a {label}; not yet timed on a CPU like this one"
        kind = "with" if bfloat16_native else "without"
        return (
            f"{command} took {elsewhere.minutes:g} min on a {elsewhere.cpu.label}; not yet timed on a CPU "
            f"{kind} native bfloat16, as this one is"
        )
    return ""


def job_times_table() -> str:
    """The table as the Main jobs page prints it (Markdown), one column per CPU kind."""
    lines = ["| command | " + " | ".join(kind.label for kind in CPU_KINDS) + " |", "|---|" + "---|" * len(CPU_KINDS)]
    for command, times in JOB_TIMES.items():
        cells = []
        for kind in CPU_KINDS:
            time = next((t for t in times if t.cpu == kind), None)
            cells.append(f"{time.minutes:g} min ({time.measured})" if time else "not timed")
        lines.append(f"| `python tuned_examples/{command}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
