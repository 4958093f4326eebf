"""A run folder's storage for Tune in which every file is whole or absent, never cut.

Tune writes a trial's results, the experiment state and each checkpoint on the driver's local disk first, then
copies them into ``storage_path`` with pyarrow. A copy the disk cannot hold (ENOSPC) or a kill stopped left the
destination truncated: ``result.json`` and ``progress.csv`` cut to a few KiB (the iterations written before were
lost too, since each copy rewrites the whole file), the experiment state cut, error files of 0 bytes.

:func:`run_storage` is the local filesystem with one change: a file is written under a hidden temporary name beside
its destination, flushed to the disk, and only then renamed over it (``os.replace`` is atomic), so the previous
version stays whole until the new one is. A write that fails removes its temporary file at once (a full disk
gets back what it lent) and raises. Main jobs pass it to Tune as ``storage_filesystem``; a checkpoint folder whose
copy failed is removed by ``StarPO.save``, so a checkpoint is whole or absent too.
"""

from __future__ import annotations

import os
import uuid

import pyarrow
import pyarrow.fs

__all__ = ["is_local_storage", "run_storage"]


class _WholeOrNothing:
    """A file object (for ``pyarrow.PythonFile``) that writes ``path`` through a temporary file: ``close`` after
    writes that all worked renames it over ``path``; a failed write deletes it, and ``path`` is left as it was."""

    def __init__(self, path: str):
        self.path = path
        folder, name = os.path.split(path)
        self.partial = os.path.join(folder, f".{name}.partial-{uuid.uuid4().hex[:8]}")
        self.file = open(self.partial, "wb", buffering=0)  # unbuffered: a full disk raises at the write it fails
        self.written = 0

    @property
    def closed(self) -> bool:
        return self.file.closed

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        try:
            done = 0
            while done < len(view):  # a raw write may take part of the bytes
                done += self.file.write(view[done:])
        except BaseException:
            self._discard()
            raise
        self.written += done
        return done

    def flush(self) -> None:
        pass  # unbuffered; the data reaches the disk at close

    def close(self) -> None:
        if self.file.closed:
            return
        try:
            os.fsync(self.file.fileno())  # a delayed allocation's ENOSPC shows here, not after the rename
            self.file.close()
            os.replace(self.partial, self.path)
        except BaseException:
            self._discard()
            raise

    def _discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        try:
            os.unlink(self.partial)
        except FileNotFoundError:
            pass


class WholeFileHandler(pyarrow.fs.FileSystemHandler):
    """pyarrow's local filesystem, whose output streams are whole-or-nothing (:class:`_WholeOrNothing`)."""

    def __init__(self):
        self.local = pyarrow.fs.LocalFileSystem()

    def __eq__(self, other) -> bool:
        return isinstance(other, WholeFileHandler)

    def __hash__(self) -> int:
        return hash(WholeFileHandler)

    def get_type_name(self) -> str:
        return "rllib_ragen-whole-files"

    def normalize_path(self, path):
        return self.local.normalize_path(path)

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("refusing to delete the contents of the filesystem's root")

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        target = _WholeOrNothing(dest)
        try:
            with self.local.open_input_stream(src) as source:
                while chunk := source.read(64 * 2**20):
                    target.write(chunk)
        except BaseException:
            target._discard()  # a failed read must not commit what was copied so far
            raise
        target.close()

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return pyarrow.PythonFile(_WholeOrNothing(path), mode="w")

    def open_append_stream(self, path, metadata):
        return self.local.open_append_stream(path)  # an append cannot be whole-or-nothing; Tune does not append


def run_storage() -> pyarrow.fs.FileSystem:
    """The local filesystem for Tune's ``storage_filesystem`` (and ``Tuner.restore``): files whole or absent."""
    return pyarrow.fs.PyFileSystem(WholeFileHandler())


def is_local_storage(filesystem) -> bool:
    """Whether Tune's storage is this machine's disk (plain, or :func:`run_storage`): paths in it are local paths."""
    return isinstance(filesystem, pyarrow.fs.LocalFileSystem) or (
        isinstance(filesystem, pyarrow.fs.PyFileSystem) and isinstance(filesystem.handler, WholeFileHandler)
    )
