"""Appends what a run produces to its directory: per-rank logs, merged log, metrics,
stack dumps.

Promise: every line of every LogLines, every MetricRecord and every StackDump passed
to :meth:`RunRecorder.record` is written, in order, and on disk after :meth:`flush`
(called once per batch). A batch of lines costs one write per file. Files are 0600;
a write that fails raises :class:`~dmlctl.runs.files.StoreError` (``DiskFull`` naming
the file, ``RunDirGone`` when the run directory was deleted).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from typing import TextIO

from dmlctl.runs.events import Event, LogLines, MetricRecord, StackDump
from dmlctl.runs.files import StoreError, make_private_dir, open_private, store_error
from dmlctl.runs.store import RunDir


class RunRecorder:
    def __init__(self, run: RunDir) -> None:
        self._run = run
        self._files: dict[str, TextIO] = {}

    def _file(self, name: str) -> TextIO:
        f = self._files.get(name)
        if f is None:
            if name == "metrics":
                path = self._run.metrics
            elif name.startswith("stacks/"):
                make_private_dir(self._run.stacks)
                path = self._run.path / name
            else:
                path = self._run.logs / name
            f = open_private(path, "a", buffering=1 << 16)
            self._files[name] = f
        return f

    def record(self, events: Iterable[Event]) -> None:
        """Append ``events``' lines, records and dumps (StoreError on failure)."""
        try:
            self._record(events)
        except OSError as e:
            raise self._error(e) from None

    def _error(self, exc: OSError) -> StoreError:
        path = exc.filename if isinstance(exc.filename, str) else self._run.logs
        return store_error(exc, path, self._run.path)

    def _record(self, events: Iterable[Event]) -> None:
        merged = self._file("merged.log")
        for ev in events:
            if isinstance(ev, LogLines):
                if not ev.lines:
                    continue
                name = f"rank-{ev.rank}.log" if ev.rank is not None else f"agent-{ev.host}.log"
                prefix = f"[rank {ev.rank}] " if ev.rank is not None else f"[{ev.host}] "
                _write(self._file(name), "\n".join(ev.lines) + "\n")
                _write(merged, prefix + ("\n" + prefix).join(ev.lines) + "\n")
            elif isinstance(ev, StackDump):
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ev.ts))
                head = f"=== rank {ev.rank} on {ev.host}, {when}"
                head += f": main thread at {ev.where}" if ev.where else ""
                text = head + " ===\n" + "".join(line + "\n" for line in ev.lines) + "\n"
                _write(self._file(f"stacks/rank-{ev.rank}.txt"), text)
            elif isinstance(ev, MetricRecord):
                rec = {
                    "ts": ev.ts,
                    "host": ev.host,
                    "rank": ev.rank,
                    "step": ev.step,
                    "values": dict(ev.values),
                }
                _write(self._file("metrics"), json.dumps(rec, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        """Hand every buffered line to the OS (StoreError on failure)."""
        for name, f in self._files.items():
            try:
                f.flush()
            except OSError as e:
                e.filename = e.filename or f.name or name
                raise self._error(e) from None

    def close(self) -> None:
        """Close every file; what cannot be flushed any more (a full disk) is dropped."""
        for f in self._files.values():
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()


def _write(f: TextIO, text: str) -> None:
    """``f.write(text)``; an OSError names ``f``'s path (a buffered write does not)."""
    try:
        f.write(text)
    except OSError as e:
        e.filename = e.filename or f.name
        raise
