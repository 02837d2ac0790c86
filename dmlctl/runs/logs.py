"""Reading a run's log files, once or following them until the run ends."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import BinaryIO

from dmlctl.errors import UsageError
from dmlctl.runs.store import RunDir

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


def stream_log(run: RunDir, rank: int | None, *, follow: bool, out: BinaryIO | None = None) -> None:
    """Copy the log to ``out`` (default stdout); with ``follow``, keep copying new
    lines until the run has ended and everything was printed."""
    sink = out if out is not None else sys.stdout.buffer
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
            return
        try:
            time.sleep(POLL_S)
        except KeyboardInterrupt:
            return
