"""Checkpoint directories that a kill cannot corrupt: write beside, then swap in.

RLlib's ``save_to_path`` writes file by file into the target directory, so a process killed halfway through
leaves the old checkpoint destroyed or, worse, a loadable mix of new weights with the old iteration and optimizer
state. :func:`write_atomically` has the writer fill a sibling ``.{name}.partial`` directory and only then moves it
into place; until that moment the old checkpoint is untouched.

Moving a directory over a non-empty one is two renames (old aside to ``.{name}.previous``, new in). A kill between
them leaves no ``name`` but a complete ``.{name}.previous``: :func:`recover_interrupted_save`, called before every
load and save, puts it back.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from typing import Callable

# Files RLlib writes at the top of every checkpoint: a directory holding one of them may be replaced.
_CHECKPOINT_MARKERS = ("metadata.json", "class_and_ctor_args.pkl", "rllib_checkpoint.json")


def _siblings(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    return path.with_name(f".{path.name}.partial"), path.with_name(f".{path.name}.previous")


def recover_interrupted_save(path) -> None:
    """Undo what a kill during :func:`write_atomically` left at ``path``: restore the previous checkpoint if the new
    one never arrived, drop a leftover copy of it if it did."""
    path = pathlib.Path(path)
    _, previous = _siblings(path)
    if previous.exists():
        if path.exists():
            shutil.rmtree(previous)  # the swap finished; only the clean-up was cut short
        else:
            os.rename(previous, path)


def write_atomically(path, write: Callable[[str], object]) -> str:
    """Run ``write(directory)`` into a sibling of ``path``, then swap it in for whatever ``path`` held.

    Raises:
        FileExistsError: ``path`` is a file, or a non-empty directory that is not a checkpoint (its files would be
            lost in the swap).
    """
    path = pathlib.Path(path)
    recover_interrupted_save(path)
    if path.exists() and (not path.is_dir() or (any(path.iterdir())
                                                 and not any((path / m).exists() for m in _CHECKPOINT_MARKERS))):
        raise FileExistsError(f"cannot save a checkpoint to {path}: it holds other files, which replacing it would "
                              "delete. Save to a new or empty directory, or to an existing checkpoint.")
    partial, previous = _siblings(path)
    shutil.rmtree(partial, ignore_errors=True)  # a save killed earlier
    path.parent.mkdir(parents=True, exist_ok=True)
    write(str(partial))
    if path.exists():
        os.rename(path, previous)
    os.rename(partial, path)
    shutil.rmtree(previous, ignore_errors=True)
    return str(path)
