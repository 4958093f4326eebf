"""Every time the README, the docs, the tuned examples and the plan line state for a job is the job-time table's
(rllib_ragen.jobs.job_times), with its CPU named."""

import pathlib
import re
import runpy

import pytest

from rllib_ragen.jobs.job_times import AVX2, EPYC_BF16, JOB_TIMES, XEON_BF16, job_time, job_times_table, timing_sentence

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Pages that state how long a job takes. The results pages and the Benchmarks page record what given runs took,
# with their dates: records, not statements.
STATING_PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md")]
MARKER = re.compile(r"<!-- time: (.+?) -->")
MINUTES = re.compile(r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:min\b|minutes)")
COMMAND = re.compile(r"tuned_examples/\w+\.py")


def _stating_lines():
    """(page, line number, line) of every page that states times, the Main jobs page's copy of the table left out
    (a test of its own compares it whole)."""
    for page in STATING_PAGES:
        skipping = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            skipping = (skipping or line == "<!-- job-times-table -->") and line != "<!-- /job-times-table -->"
            if not skipping:
                yield page, number, line


def _figures(command: str) -> list[str]:
    return [f"{t.minutes:g} min" for t in JOB_TIMES[command]]


def test_each_marked_statement_quotes_the_tables_figures_for_its_command():
    marked = 0
    for page, number, line in _stating_lines():
        for command in MARKER.findall(line):
            marked += 1
            assert command in JOB_TIMES, f"{page.name}:{number}: {command!r} is not in JOB_TIMES"
            text = MARKER.sub("", line)
            missing = [f for f in _figures(command) if f not in text]
            assert not missing, f"{page.name}:{number}: states {command!r} without {missing}: {line}"
            stray = set(MINUTES.findall(text)) - set(_figures(command))
            assert not stray, f"{page.name}:{number}: {sorted(stray)} are not the table's for {command!r}"
    assert marked >= 5  # the README's, Getting started's, the Main jobs page's and Scaling's


def test_a_job_command_beside_a_time_is_marked():
    """A time stated beside a job's command must carry its marker, so that the test above checks it."""
    for page, number, line in _stating_lines():
        if COMMAND.search(line) and MINUTES.search(line):
            assert MARKER.search(line), f"{page.name}:{number}: a job's time with no <!-- time: ... -->: {line}"


def test_the_main_jobs_page_prints_the_whole_table():
    page = (ROOT / "docs" / "main-jobs.md").read_text()
    start, end = "<!-- job-times-table -->\n", "\n<!-- /job-times-table -->"
    assert page[page.index(start) + len(start) : page.index(end)] == job_times_table()


@pytest.mark.parametrize("script", sorted({c.split()[0] for c in JOB_TIMES}))
def test_each_tuned_examples_docstring_points_at_the_table_and_quotes_no_figure_of_its_own(script):
    docstring_time = next(
        line for line in (ROOT / "tuned_examples" / script).read_text().splitlines() if line.startswith("Time:")
    )
    assert "rllib_ragen/jobs/job_times.py" in docstring_time and not MINUTES.search(docstring_time), docstring_time


def test_the_plan_line_names_the_cpu_kind_and_admits_an_untimed_one():
    assert (
        timing_sentence("starpo_bandit.py", True, amx=True)
        == f"starpo_bandit.py took 1.2 min on a {XEON_BF16.label}, a CPU of this kind"
    )
    assert timing_sentence("starpo_bandit.py", True) == (  # an EPYC: native bfloat16 too, but no AMX
        f"starpo_bandit.py took 1.2 min on a {XEON_BF16.label}; not yet timed on a CPU like this one"
    )
    assert EPYC_BF16.bfloat16_native and not EPYC_BF16.amx
    assert (
        timing_sentence("starpo_bandit.py", False)
        == f"starpo_bandit.py took 2.5 min on a {AVX2.label}, a CPU of this kind"
    )
    assert timing_sentence("starpo_sokoban.py", True) == (
        f"starpo_sokoban.py took 21.5 min on a {AVX2.label}; not yet timed on a CPU with native bfloat16, as this "
        "one is"
    )
    assert timing_sentence("starpo_sokoban.py --preset smollm2-cpu", True) == ""  # never timed: nothing stated
    assert job_time("starpo_frozenlake.py --quick", True, amx=True)[0].minutes == 2.0
    assert job_time("starpo_frozenlake.py --quick", True) == (
        None,
        job_time("starpo_frozenlake.py --quick", True, True)[0],
    )
    epyc, _ = job_time("starpo_selfplay.py", True)
    assert epyc.cpu == EPYC_BF16 and epyc.minutes == 13.5  # an EPYC's own figure
    # A Xeon with AMX is told the EPYC's figure for the SmolLM2 preset, as another CPU's.
    assert timing_sentence("starpo_frozenlake.py --preset smollm2-cpu", True, amx=True) == (
        f"starpo_frozenlake.py --preset smollm2-cpu took 61.1 min on a {EPYC_BF16.label}; not yet timed on a CPU like "
        "this one"
    )


@pytest.mark.parametrize(
    "flags, timed",
    [
        ([], "starpo_frozenlake.py"),
        (["--seed", "1"], "starpo_frozenlake.py"),
        (["--preset", "smollm2-cpu"], "starpo_frozenlake.py --preset smollm2-cpu"),
        (["--quick"], "starpo_frozenlake.py --quick"),
        (["--timed-command", ""], ""),
    ],
)
def test_the_job_looks_up_the_command_as_run_preset_and_quick_included(flags, timed):
    job_file = runpy.run_path(str(ROOT / "tuned_examples" / "starpo_frozenlake.py"), run_name="imported")
    _, job, _, _ = job_file["parse_args"](job_file["config"], job_file["job"], flags)
    assert job.timed_command == timed
