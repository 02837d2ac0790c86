"""Writing a run's files: private (0600 files, 0700 folders), atomic where readers
need it, and every failure turned into one typed error.

A run directory holds the job's environment (redacted, with the real values in a
file only the owner reads) and everything the ranks printed, so nothing in it is
readable by other users. The writers here never leave a temporary file behind,
and say why they failed: :class:`DiskFull` (no space or quota left, naming the
path), :class:`RunDirGone` (the run directory was deleted) or :class:`StoreError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, TextIO

from dmlctl.errors import DmlctlError
from dmlctl.failure import FULL_DISK_ERRNOS
from dmlctl.private_files import PRIVATE_DIR, PRIVATE_FILE, make_private_dirs, private_opener

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "DiskFull",
    "Reserve",
    "RunDirGone",
    "StoreError",
    "atomic_write",
    "make_private_dir",
    "open_private",
    "private_opener",
    "store_error",
]

FILE_MODE = PRIVATE_FILE
DIR_MODE = PRIVATE_DIR
RESERVE_BYTES = 1 << 20
"""Space a running run keeps aside (``.reserve``): on a full disk its final state is
written into these blocks (nobody else can take them, the ranks' own output on the
same file system included), see :meth:`Reserve.put`."""

_GONE = (errno.ENOENT, errno.ESTALE, errno.ENOTDIR)


class StoreError(DmlctlError):
    """A file of a run could not be written; ``path`` names it."""

    kind = "StoreError"

    def __init__(self, path: Path | str, message: str) -> None:
        self.path = str(path)
        super().__init__(message)


class DiskFull(StoreError):
    """The file system holding the run is full (or the user's quota is used up)."""

    kind = "DiskFull"


class RunDirGone(StoreError):
    """The run directory was deleted (or replaced) while the run was running."""

    kind = "RunDirGone"


def store_error(exc: OSError, path: Path | str, run_dir: Path | None = None) -> StoreError:
    """The typed error for ``exc``, raised writing ``path`` (inside ``run_dir``)."""
    if exc.errno in FULL_DISK_ERRNOS:
        return DiskFull(path, f"no space left on the device writing {path}")
    if exc.errno in _GONE and run_dir is not None and not run_dir.is_dir():
        return RunDirGone(run_dir, f"the run directory {run_dir} was deleted")
    return StoreError(path, f"cannot write {path}: {exc.strerror or exc}")


def open_private(path: Path, mode: Literal["a", "w"] = "a", buffering: int = -1) -> TextIO:
    """``open(path, mode)`` (text, UTF-8) creating the file with mode 0600."""
    return open(path, mode, encoding="utf-8", buffering=buffering, opener=private_opener)


def make_private_dir(path: Path) -> None:
    """Create ``path`` and missing parents, each with mode 0700; fine if it exists."""
    make_private_dirs(str(path))


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) so readers see the old or the new content,
    never a mix. On failure the temporary file is removed and the OSError raised."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", opener=private_opener) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """New files and folders of this process get no group or other permissions
    (for what is written by code that takes no mode: tar extraction, children)."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


class Reserve:
    """:data:`RESERVE_BYTES` kept in ``path`` while a run runs (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def take(self) -> None:
        """Allocate the reserve (real blocks: zeros written and synced)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            block = b"\0" * 65536
            for _ in range(RESERVE_BYTES // len(block)):
                os.write(fd, block)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                self.path.unlink()
            raise
        os.close(fd)

    def put(self, path: Path, text: str) -> None:
        """Write ``text`` into the reserve's own blocks and move the reserve to ``path``
        (atomic, like :func:`atomic_write`): needs no free space. OSError when there is
        no reserve or ``text`` is larger than it."""
        data = text.encode("utf-8")
        if len(data) > RESERVE_BYTES:
            raise OSError(errno.EFBIG, "larger than the reserve", str(path))
        fd = os.open(self.path, os.O_WRONLY)  # no O_TRUNC: the blocks are kept
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.path, path)

    def release(self) -> None:
        """Give the space back (nothing if there is no reserve)."""
        with contextlib.suppress(OSError):
            self.path.unlink()
