"""Where a thread is, in one line: the script's own innermost frame and the frame it
is blocked in (torch-free, standard library only).

Used by the heartbeat (the main thread's position every second) and by the
controller's reading of ``faulthandler`` dumps, so both name frames alike:
``train.py:88 in step`` for the user's code (path relative to the script's directory)
and ``threading.py:320 in wait`` (file name only) for library code.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from types import FrameType


def library_dirs() -> tuple[str, ...]:
    """Directories whose code is not the user's: the standard library, every
    site-packages directory and dmlctl itself (real paths, with a trailing slash)."""
    dirs = {
        sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
    dirs.update(getattr(site, "getsitepackages", lambda: [])())
    dirs.add(getattr(site, "getusersitepackages", lambda: "")())
    dirs.update(p for p in sys.path if "site-packages" in p or "dist-packages" in p)
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dmlctl/
    return tuple(sorted(os.path.join(os.path.realpath(d), "") for d in dirs if d))


class FrameNamer:
    """Labels frames relative to ``script_dir`` and tells user code from library code.

    A frame is the user's when its file lies under ``script_dir`` and in none of
    ``libraries``; when a stack has no such frame, the innermost frame outside the
    libraries counts (code the user keeps elsewhere).
    """

    def __init__(self, script_dir: str, libraries: Sequence[str] | None = None) -> None:
        self.script_dir = os.path.join(os.path.realpath(script_dir), "")
        self.libraries = tuple(library_dirs() if libraries is None else libraries)
        self._cache: dict[str, tuple[bool, bool, str]] = {}

    def _file(self, filename: str) -> tuple[bool, bool, str]:
        """(under the script dir, outside the libraries, label) of ``filename``."""
        known = self._cache.get(filename)
        if known is None:
            if filename.startswith("<"):
                known = (False, False, filename)
            else:
                path = os.path.realpath(filename)
                outside = not any(path.startswith(d) for d in self.libraries)
                # A library directory that holds the script itself (a job kept inside
                # a package) does not make the script's code a library's.
                mine = path.startswith(self.script_dir) and not any(
                    path.startswith(d) for d in self.libraries if not self.script_dir.startswith(d)
                )
                label = os.path.relpath(path, self.script_dir) if mine else os.path.basename(path)
                known = (mine, outside, label)
            self._cache[filename] = known
        return known

    def label(self, filename: str, lineno: int, func: str) -> str:
        """``train.py:88 in step``."""
        return f"{self._file(filename)[2]}:{lineno} in {func}"

    def summary(self, frames: Iterable[tuple[str, int, str]]) -> tuple[str | None, str | None]:
        """``(where, inner)`` of a stack given innermost first as (file, line, function):
        the user's innermost frame (None if the stack has none) and the innermost frame."""
        inner: str | None = None
        fallback: str | None = None
        for filename, lineno, func in frames:
            if inner is None:
                inner = self.label(filename, lineno, func)
            mine, outside, _ = self._file(filename)
            if mine:
                return self.label(filename, lineno, func), inner
            if outside and fallback is None:
                fallback = self.label(filename, lineno, func)
        return fallback, inner


def frames_of(frame: FrameType | None, limit: int = 200) -> list[tuple[str, int, str]]:
    """A live stack as (file, line, function), innermost first."""
    out: list[tuple[str, int, str]] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append((code.co_filename, frame.f_lineno or 0, code.co_name))
        frame = frame.f_back
    return out
