"""Reading spec files as text: every failure becomes a file-level :class:`SpecIssue`."""

from __future__ import annotations

import os
import stat
from typing import Literal

from dmlctl.errors import SpecError, SpecIssue

MAX_SPEC_BYTES = 1 << 20
"""Spec files larger than this are refused (they are a few hundred bytes in practice)."""

PathKind = Literal["file", "directory", "other", "missing"]


def read_text(file: str, expected: str) -> str:
    """The text of ``file`` (UTF-8, BOM dropped), or SpecError with one file-level issue.

    ``expected`` completes "is a directory; expected …" (e.g. ``"a YAML file"``).
    Refuses files over :data:`MAX_SPEC_BYTES`, with NUL bytes or invalid UTF-8;
    never raises anything else.
    """

    def fail(message: str) -> SpecError:
        return SpecError([SpecIssue(file, None, "", message)])

    try:
        with open(file, "rb") as stream:
            raw = stream.read(MAX_SPEC_BYTES + 1)
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
