"""Follow the rank files in a rank directory and turn new bytes into whole lines."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

_NAME = re.compile(r"^rank-(\d+)\.(stdout|stderr|events\.jsonl)$")
CHUNK = 1 << 18
MAX_LINE = 1 << 20  # bytes without a newline after which they are passed on as a line


@dataclass
class _Follow:
    rank: int
    kind: str  # "stdout" | "stderr" | "events.jsonl"
    fd: int
    partial: bytes = b""


class RankDirTailer:
    """Reads every ``rank-<R>.{stdout,stderr,events.jsonl}`` file in ``rank_dir`` from
    its start; each :meth:`poll` returns the complete lines written since the last one.

    Promise: every byte written is returned exactly once, in order per file; one poll
    reads at most about :data:`CHUNK` bytes per file (memory stays bounded however far
    behind the reader is); a last line without newline is returned by :meth:`poll`
    with ``final=True`` once the file has been read to its end.
    """

    def __init__(self, rank_dir: str) -> None:
        self.rank_dir = rank_dir
        self._files: dict[str, _Follow] = {}
        #: Ranks whose stdout or stderr the last poll did not read to its end.
        self.behind: set[int] = set()

    def _discover(self) -> None:
        try:
            names = os.listdir(self.rank_dir)
        except FileNotFoundError:
            return
        for name in names:
            if name in self._files:
                continue
            m = _NAME.match(name)
            if m is None:
                continue
            try:
                fd = os.open(os.path.join(self.rank_dir, name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            self._files[name] = _Follow(int(m.group(1)), m.group(2), fd)

    def poll(self, final: bool = False) -> Iterator[tuple[int, str, list[str]]]:
        """Yield ``(rank, kind, lines)`` for every file with new complete lines."""
        self._discover()
        self.behind = set()
        for f in self._files.values():
            data = b""
            at_end = False
            while len(data) < CHUNK:
                chunk = os.read(f.fd, CHUNK - len(data))
                if not chunk:
                    at_end = True
                    break
                data += chunk
            if not at_end and f.kind != "events.jsonl":
                self.behind.add(f.rank)
            if not data and not (final and f.partial):
                continue
            data = f.partial + data
            parts = data.split(b"\n")
            f.partial = parts.pop()
            if len(f.partial) > MAX_LINE:  # no newline for this long: pass it on as is
                parts.append(f.partial)
                f.partial = b""
            if final and at_end and f.partial:
                parts.append(f.partial)
                f.partial = b""
            if parts:
                yield f.rank, f.kind, [p.decode("utf-8", "replace").rstrip("\r") for p in parts]

    def close(self) -> None:
        for f in self._files.values():
            os.close(f.fd)
        self._files.clear()
