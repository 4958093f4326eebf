"""A save killed at any moment leaves a loadable, self-consistent checkpoint: the old one, byte for byte, or the
new one, never a mix."""

import filecmp
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from rllib_ragen.starpo.checkpoints import recover_interrupted_save, write_atomically

# Resume the checkpoint, train one more iteration and save it back over itself; the process kills itself
# (SIGKILL: no clean-up runs) when RLlib opens its KILL_AT-th checkpoint file, either before writing it or
# halfway through its bytes.
_SAVE_AND_DIE = textwrap.dedent("""
    import os, signal, sys, types
    import pyarrow.fs, ray, ray.rllib.utils.checkpoints as rllib_checkpoints
    from rllib_ragen import StarPO

    path, kill_at, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    opened = 0

    class HalfWrittenStream:
        def __init__(self, stream): self.stream = stream
        def __enter__(self): return self
        def __exit__(self, *exc): return False
        def write(self, data):
            self.stream.write(bytes(data)[: len(data) // 2]); self.stream.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    class KillingFileSystem:
        def __init__(self, fs): self.fs = fs
        def __getattr__(self, name): return getattr(self.fs, name)
        def open_output_stream(self, file, *args, **kwargs):
            global opened
            opened += 1
            if opened == kill_at and mode == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            stream = self.fs.open_output_stream(file, *args, **kwargs)
            return HalfWrittenStream(stream) if opened == kill_at else stream

    def from_uri(uri):
        fs, inner = pyarrow.fs.FileSystem.from_uri(uri)
        return KillingFileSystem(fs), inner

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    algo = StarPO.from_checkpoint(path)
    algo.train()
    rllib_checkpoints.pyarrow = types.SimpleNamespace(
        fs=types.SimpleNamespace(FileSystem=types.SimpleNamespace(from_uri=from_uri)))
    algo.save_to_path(path)
    print("the save finished: kill point", kill_at, "was never reached")
""")


def _same_tree(a: pathlib.Path, b: pathlib.Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files_a)


@pytest.mark.slow
def test_a_save_killed_at_any_moment_leaves_the_old_checkpoint_intact(ray_session, small_config, tmp_path):
    import shutil

    from rllib_ragen import StarPO

    path, pristine = tmp_path / "checkpoint", tmp_path / "pristine"
    algo = small_config().build_algo()
    algo.train()
    algo.save_to_path(path)
    algo.stop()
    shutil.copytree(path, pristine)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # RLlib writes 18 files per checkpoint: the first, the module weights (11th) and the algorithm state (last).
    for kill_at, mode in [(1, "before"), (11, "half"), (14, "before"), (18, "half")]:
        run = subprocess.run(
            [sys.executable, "-c", _SAVE_AND_DIE, str(path), str(kill_at), mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == -9, (kill_at, mode, run.stdout[-2000:], run.stderr[-3000:])
        assert _same_tree(path, pristine), f"killed at file {kill_at} ({mode}): the checkpoint changed"

    resumed = StarPO.from_checkpoint(path)  # loadable, and the next save replaces it whole
    assert resumed.iteration == 1
    resumed.train()
    resumed.save_to_path(path)
    resumed.stop()
    assert not any(p.name.startswith(".checkpoint.") for p in tmp_path.iterdir())  # the killed saves' leftovers
    again = StarPO.from_checkpoint(path)
    assert again.iteration == 2
    again.stop()


def _write(files: dict):
    def write(directory):
        os.makedirs(directory)
        for name, text in files.items():
            pathlib.Path(directory, name).write_text(text)

    return write


def test_a_kill_between_the_two_renames_is_recovered_on_load(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint"
    write_atomically(path, _write({"metadata.json": "old"}))
    renames = []
    real_rename = os.rename

    def rename_then_die(src, dst):
        renames.append(dst)
        if len(renames) == 2:  # the old checkpoint is aside, the new one not yet in place
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_then_die)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(path, _write({"metadata.json": "new"}))
    monkeypatch.setattr(os, "rename", real_rename)
    assert not path.exists()
    recover_interrupted_save(path)  # what every load and save does first
    assert (path / "metadata.json").read_text() == "old"
    write_atomically(path, _write({"metadata.json": "new"}))
    assert (path / "metadata.json").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["checkpoint"]


def test_a_directory_holding_other_files_is_never_replaced(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "metrics.csv").write_text("iteration\n1\n")
    with pytest.raises(FileExistsError, match="it holds other files"):
        write_atomically(tmp_path / "results", _write({"metadata.json": "x"}))
    assert (tmp_path / "results" / "metrics.csv").read_text() == "iteration\n1\n"
