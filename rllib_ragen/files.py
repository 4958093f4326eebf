"""Files written whole or not at all: a kill or a full disk at any moment leaves the old file or the new one, never
half of one. Every layer writes through these (run folders, reports, the sentinel's rollback points); Tune's own
copies go through ``jobs/storage.py``, a pyarrow file object built on the same rename."""

from __future__ import annotations

import contextlib
import os
import pathlib


@contextlib.contextmanager
def written_whole(path: pathlib.Path):
    """Yields a temporary path beside ``path`` to write; it replaces ``path`` when the block ends, and is removed if
    the block raises (a full disk)."""
    path = pathlib.Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)


def write_text_atomically(path: pathlib.Path, text: str) -> None:
    with written_whole(path) as partial:
        partial.write_text(text, encoding="utf-8")
