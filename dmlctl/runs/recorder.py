"""Appends what a run produces to its directory: per-rank logs, merged log, metrics.

Promise: every LogLine and MetricRecord passed to :meth:`RunRecorder.record` is
written, in order, and on disk after :meth:`flush` (called once per batch).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TextIO

from dmlctl.launch.events import Event, LogLine, MetricRecord
from dmlctl.runs.store import RunDir


class RunRecorder:
    def __init__(self, run: RunDir) -> None:
        self._run = run
        self._files: dict[str, TextIO] = {}

    def _file(self, name: str) -> TextIO:
        f = self._files.get(name)
        if f is None:
            path = self._run.metrics if name == "metrics" else self._run.logs / name
            f = open(path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
            self._files[name] = f
        return f

    def record(self, events: Iterable[Event]) -> None:
        merged = self._file("merged.log")
        for ev in events:
            if isinstance(ev, LogLine):
                if ev.rank is not None:
                    self._file(f"rank-{ev.rank}.log").write(ev.text + "\n")
                    merged.write(f"[rank {ev.rank}] {ev.text}\n")
                else:
                    self._file(f"agent-{ev.host}.log").write(ev.text + "\n")
                    merged.write(f"[{ev.host}] {ev.text}\n")
            elif isinstance(ev, MetricRecord):
                rec = {"ts": ev.ts, "host": ev.host, "rank": ev.rank, "step": ev.step,
                       "values": dict(ev.values)}
                self._file("metrics").write(json.dumps(rec, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
