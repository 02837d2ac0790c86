"""Reading spec files as text: every failure becomes a file-level :class:`SpecIssue`."""

from __future__ import annotations

import os
import stat
from typing import Literal

from dmlctl.errors import SpecError, SpecIssue

MAX_SPEC_BYTES = 256 * 1024
"""Spec files larger than this are refused (they are a few hundred bytes in practice,
a few tens of KiB for a cluster of hundreds of hosts)."""

PathKind = Literal["file", "directory", "other", "missing"]


def read_text(file: str, expected: str) -> str:
    """The text of ``file`` (UTF-8, BOM dropped), or SpecError with one file-level issue.

    ``expected`` completes "is a directory; expected …" (e.g. ``"a YAML file"``).
    Only a regular file (symbolic links followed) is read: a FIFO, socket or device
    is refused without opening it for good (never blocks). Refuses files over
    :data:`MAX_SPEC_BYTES`, with NUL bytes or invalid UTF-8; never raises anything else.
    """

    def fail(message: str) -> SpecError:
        return SpecError([SpecIssue(file, None, "", message)])

    try:
        raw = _read_regular(file)
    except _NotRegular as exc:
        raise fail(f"not a regular file ({exc.kind}); expected {expected}") from None
    except FileNotFoundError:
        raise fail("no such file") from None
    except IsADirectoryError:
        raise fail(f"is a directory; expected {expected}") from None
    except PermissionError:
        raise fail("cannot read the file: permission denied") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise fail(f"cannot read the file: {reason}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise fail(f"file is larger than {MAX_SPEC_BYTES} bytes; not a spec file")
    if b"\x00" in raw:
        raise fail("not a text file (contains NUL bytes)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail(f"not a text file (not valid UTF-8 at byte {exc.start})") from None


class _NotRegular(Exception):
    def __init__(self, kind: str) -> None:
        self.kind = kind


_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _read_regular(file: str) -> bytes:
    """At most :data:`MAX_SPEC_BYTES` + 1 bytes of ``file`` if it is a regular file.

    Opened with ``O_NONBLOCK`` (a FIFO swapped in after a check never blocks the
    open) and checked on the open descriptor, so the answer is about what was read.
    """
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(file)
        if not stat.S_ISREG(mode):
            raise _NotRegular(next((k for test, k in _KINDS if test(mode)), "a special file"))
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def path_kind(path: str | os.PathLike[str]) -> PathKind:
    """What ``path`` is (symlinks followed); ``"missing"`` also when it cannot be reached.

    Unlike :meth:`pathlib.Path.is_file`, never raises (names too long, NUL bytes, loops).
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "missing"
    if stat.S_ISREG(mode):
        return "file"
    return "directory" if stat.S_ISDIR(mode) else "other"
