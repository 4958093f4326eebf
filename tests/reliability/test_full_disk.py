"""A main job whose disk fills: Tune's copies into the run folder used to cut result.json, progress.csv, the
experiment state and the error files (0 bytes), leave a half-written checkpoint_<n>/, and end in a logging
traceback that hid the advice to resume; the resume then stopped the trial short, as if interrupted. Now every file
in the run folder is whole or absent, the failed checkpoint is removed, the job's last words are the cause and the
resume command, and the resume after freeing space finishes the run."""

import json
import pickle
import subprocess
import sys
import types

import pytest

from tests.test_tuned_examples import CPU_ONLY, ROOT

# The tiny model's checkpoint is ~25 MB (weights and AdamW's moments): a 36 MB disk holds the first checkpoint
# and not the second. Small rollouts and no warm start keep the two job runs short.
DISK_MB = 36
ITERATIONS = 2
FLAGS = [
    "--model",
    "tiny",
    "--iterations",
    str(ITERATIONS),
    "--warm-start-steps",
    "0",
    "--num-groups",
    "2",
    "--group-size",
    "2",
    "--validation-size",
    "4",
    "--validation-interval",
    "0",
    "--checkpoint-interval",
    "1",
    "--run-name",
    "full",
]


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of DISK_MB MiB at tmp_path/disk (root only: skipped with the reason elsewhere): ``.path``, and
    ``.resize(mb)``."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs here ({mounted.stderr.strip() or 'mount failed'}): the full-disk "
            "test needs root"
        )

    def resize(mb: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={mb}m", str(disk)], check=True)

    try:
        yield types.SimpleNamespace(path=disk, resize=resize)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _job(disk, *extra):
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "tuned_examples" / "starpo_sokoban.py"),
            *FLAGS,
            *extra,
            "--output-dir",
            str(disk.path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=CPU_ONLY,
        timeout=900,
    )


def _assert_whole(run):
    """Every file Tune or the job wrote is whole: no empty or partial file, every JSON and pickle loads."""
    files = [p for p in run.rglob("*") if p.is_file()]
    assert not [p for p in files if ".partial" in p.name], files
    assert not [p for p in files if p.stat().st_size == 0 and p.name != ".validate_storage_marker"], files
    for result_file in run.rglob("result.json"):
        [json.loads(line) for line in result_file.read_text().splitlines()]
    for state in run.glob("experiment_state-*.json"):
        json.loads(state.read_text())
    for checkpoint in run.rglob("checkpoint_*"):
        assert (checkpoint / "rllib_checkpoint.json").is_file(), checkpoint
        for stored in checkpoint.rglob("*.pkl"):
            with open(stored, "rb") as f:
                pickle.load(f)  # a cut pickle raises


@pytest.mark.slow
def test_a_full_disk_loses_nothing_written_and_the_resume_finishes(small_disk):
    full = _job(small_disk)
    assert full.returncode != 0, full.stdout[-2000:]
    last_words = full.stderr.strip().splitlines()[-1]
    assert "No space left on device" in last_words and "The disk holding" in last_words, full.stderr[-3000:]
    resume = f"--resume --output-dir {small_disk.path / 'out'} --run-name full"
    assert resume in last_words
    assert "--- Logging error ---" not in full.stderr  # one line about job.log at most, not a traceback per notice
    run = small_disk.path / "out" / "full"
    _assert_whole(run)
    trial = run / "seed0"
    kept = [json.loads(line)["training_iteration"] for line in (trial / "result.json").read_text().splitlines()]
    assert kept[:1] == [1], kept  # the iterations reported before the disk filled are still there
    assert sorted(p.name for p in trial.glob("checkpoint_*")) == ["checkpoint_000000"]  # the cut one was removed

    small_disk.resize(400)
    resumed = _job(small_disk, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_whole(run)
    done = [json.loads(line)["training_iteration"] for line in (trial / "result.json").read_text().splitlines()]
    assert done[-1] == ITERATIONS and set(done) == set(range(1, ITERATIONS + 1)), done
    assert "below the bar" in resumed.stdout or "above the bar" in resumed.stdout  # the finished run's table


def test_the_run_storage_keeps_the_old_file_whole_when_a_write_fails(tmp_path):
    """Without root for a small disk: a write that fails part-way (as ENOSPC does) leaves the previous version and
    no temporary file; a write that works replaces it; Tune's copies and pickling (to trial actors) work."""
    import errno

    import pyarrow.fs

    from rllib_ragen.jobs.storage import _WholeOrNothing, is_local_storage, run_storage

    storage = run_storage()
    target = tmp_path / "result.json"
    with storage.open_output_stream(str(target)) as f:
        f.write(b'{"training_iteration": 1}\n')

    class FillsUp:  # the temporary file's raw writes: the second one finds the disk full
        def __init__(self, file):
            self.file, self.writes = file, 0

        def write(self, data):
            self.writes += 1
            if self.writes > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

    handle = _WholeOrNothing(str(target))
    handle.file = FillsUp(handle.file)
    handle.write(b'{"training_iteration": 1}\n')
    with pytest.raises(OSError, match="No space left"):
        handle.write(b'{"training_iteration": 2}\n' * 1000)
    handle.close()  # after a failed write: nothing to commit
    assert target.read_text() == '{"training_iteration": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # the temporary file is gone

    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "state.pkl").write_bytes(pickle.dumps(list(range(10_000))))
    pyarrow.fs.copy_files(str(source), str(tmp_path / "copy"), destination_filesystem=storage)
    assert pickle.loads((tmp_path / "copy" / "sub" / "state.pkl").read_bytes()) == list(range(10_000))
    assert is_local_storage(pickle.loads(pickle.dumps(storage)))
    assert not [p for p in tmp_path.rglob("*") if ".partial" in p.name]
