"""Appends what a run produces to its directory: per-rank logs, merged log, metrics,
stack dumps.

Promise: every line of every LogLines, every MetricRecord and every StackDump passed
to :meth:`RunRecorder.record` is written, in order, and on disk after :meth:`flush`
(called once per batch). A batch of lines costs one write per file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TextIO

from dmlctl.launch.events import Event, LogLines, MetricRecord, StackDump
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
                self._run.stacks.mkdir(exist_ok=True)
                path = self._run.path / name
            else:
                path = self._run.logs / name
            f = open(path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
            self._files[name] = f
        return f

    def record(self, events: Iterable[Event]) -> None:
        merged = self._file("merged.log")
        for ev in events:
            if isinstance(ev, LogLines):
                if not ev.lines:
                    continue
                name = f"rank-{ev.rank}.log" if ev.rank is not None else f"agent-{ev.host}.log"
                prefix = f"[rank {ev.rank}] " if ev.rank is not None else f"[{ev.host}] "
                self._file(name).write("\n".join(ev.lines) + "\n")
                merged.write(prefix + ("\n" + prefix).join(ev.lines) + "\n")
            elif isinstance(ev, StackDump):
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ev.ts))
                head = f"=== rank {ev.rank} on {ev.host}, {when}"
                head += f": main thread at {ev.where}" if ev.where else ""
                self._file(f"stacks/rank-{ev.rank}.txt").write(
                    head + " ===\n" + "".join(line + "\n" for line in ev.lines) + "\n"
                )
            elif isinstance(ev, MetricRecord):
                rec = {
                    "ts": ev.ts,
                    "host": ev.host,
                    "rank": ev.rank,
                    "step": ev.step,
                    "values": dict(ev.values),
                }
                self._file("metrics").write(json.dumps(rec, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
