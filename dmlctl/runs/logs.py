"""Reading a run's log files, once or following them until the run ends."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import BinaryIO

from dmlctl.errors import UsageError
from dmlctl.runs.store import RunDir
from dmlctl.text import clean_line

POLL_S = 0.2


def log_path(run: RunDir, rank: int | None) -> Path:
    """The merged log, or rank ``rank``'s log (UsageError if the run has no such rank)."""
    if rank is None:
        return run.logs / "merged.log"
    state = run.read_state()
    known = {r.rank for r in state.ranks}
    if rank not in known:
        span = f"ranks 0 to {max(known)}" if known else "no ranks"
        raise UsageError(f"run {run.run_id} has {span}; there is no rank {rank}")
    return run.rank_log(rank)


class EscapedLines:
    """A byte sink that writes each whole line as :func:`~dmlctl.text.clean_line`
    shows it (colours dropped, other control characters escaped), so that no rank
    can move, retitle or reprogram the terminal; a line not yet ended waits."""

    def __init__(self, sink: BinaryIO) -> None:
        self._sink = sink
        self._partial = b""

    def write(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._sink.write(clean_line(line.decode("utf-8", "replace")).encode() + b"\n")

    def flush(self) -> None:
        self._sink.flush()

    def close(self) -> None:
        """Write the last line, even without its newline."""
        if self._partial:
            self.write(b"\n")
        self.flush()


def stream_log(
    run: RunDir,
    rank: int | None,
    *,
    follow: bool,
    out: BinaryIO | None = None,
    escape: bool = False,
) -> int:
    """Copy the log to ``out`` (default stdout); with ``follow``, keep copying new
    lines until the run has ended and everything was printed. With ``escape`` each
    line is made safe for a terminal (:class:`EscapedLines`). Returns the bytes read."""
    sink = out if out is not None else sys.stdout.buffer
    if not escape:
        return _copy(run, rank, follow, sink)
    lines = EscapedLines(sink)
    try:
        return _copy(run, rank, follow, lines)
    finally:
        lines.close()


def _copy(run: RunDir, rank: int | None, follow: bool, sink: BinaryIO | EscapedLines) -> int:
    """:func:`stream_log`'s loop: copy what the log has, again until the run ended."""
    path = log_path(run, rank)
    pos = 0
    while True:
        ended = not follow or run.read_state().phase.terminal
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                data = f.read()
        except FileNotFoundError:
            data = b""
        if data:
            sink.write(data)
            sink.flush()
            pos += len(data)
        if ended:
            return pos
        try:
            time.sleep(POLL_S)
        except KeyboardInterrupt:
            return pos


def print_host_files(
    run: RunDir, rank: int | None, out: BinaryIO | None = None, *, escape: bool = False
) -> None:
    """Print the rank files collected from the hosts (``hosts/<host>/rank-N.stdout``
    and ``.stderr``): one rank's raw output, or every rank's with ``[rank N]``; with
    ``escape``, each line made safe for a terminal (:class:`EscapedLines`)."""
    raw = out if out is not None else sys.stdout.buffer
    sink: BinaryIO | EscapedLines = EscapedLines(raw) if escape else raw
    found: dict[int, list[Path]] = {}
    for path in sorted((run.path / "hosts").glob("*/rank-*.std*")):
        n = path.name.split(".", 1)[0].removeprefix("rank-")
        if n.isdigit():
            found.setdefault(int(n), []).append(path)
    if rank is not None and rank not in found:
        raise UsageError(f"no files of rank {rank} were collected from the hosts of {run.run_id}")
    for r in sorted(found) if rank is None else [rank]:
        for path in found[r]:
            prefix = b"" if rank is not None else f"[rank {r}] ".encode()
            for line in path.read_bytes().splitlines(keepends=True):
                sink.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
    sink.flush()


def print_stacks(run: RunDir, rank: int | None, out: BinaryIO | None = None) -> None:
    """Print the stack dumps taken when a hang was detected (``stacks/rank-N.txt``):
    one rank's, or every rank's in rank order. UsageError when there are none."""
    sink = out if out is not None else sys.stdout.buffer
    found = {}
    for path in run.stacks.glob("rank-*.txt") if run.stacks.is_dir() else ():
        n = path.stem.removeprefix("rank-")
        if n.isdigit():
            found[int(n)] = path
    if not found:
        raise UsageError(
            f"run {run.run_id} has no stack dumps (they are taken when a hang is detected)"
        )
    if rank is not None and rank not in found:
        have = ", ".join(map(str, sorted(found)))
        raise UsageError(f"run {run.run_id} has no stack dump of rank {rank} (ranks: {have})")
    for r in sorted(found) if rank is None else [rank]:
        sink.write(found[r].read_bytes())
    sink.flush()
