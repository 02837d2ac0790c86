"""The last stderr lines of every rank, given to root causes that lack a traceback."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from dmlctl.failure import Evidence, Failure
from dmlctl.runs.events import AgentExited, Event, LogLines, RankExited, Stream

STDERR_TAIL = 20


class StderrTails:
    """Keeps each rank's last :data:`STDERR_TAIL` stderr lines (of one attempt: make a
    new one per attempt) and puts them into causes that have no Python traceback."""

    def __init__(self) -> None:
        self._tails: dict[int, collections.deque[str]] = {}

    def _with_stderr(self, cause: Failure) -> Failure:
        """A rank's cause without a Python traceback (killed by a signal, SystemExit)
        gets that rank's last stderr lines instead."""
        lines = self._tails.get(cause.rank) if cause.rank is not None else None
        if not lines or (cause.traceback and cause.evidence is not Evidence.EXIT):
            return cause
        return dataclasses.replace(cause, traceback=tuple(lines))

    def attach(self, batch: Sequence[Event]) -> list[Event]:
        """``batch`` with stderr lines remembered and exit causes completed, in order."""
        out: list[Event] = []
        for ev in batch:
            if isinstance(ev, LogLines) and ev.stream == Stream.STDERR and ev.rank is not None:
                tail = self._tails.get(ev.rank)
                if tail is None:
                    tail = self._tails[ev.rank] = collections.deque(maxlen=STDERR_TAIL)
                tail.extend(ev.lines)
            elif isinstance(ev, (RankExited, AgentExited)) and ev.cause is not None:
                ev = dataclasses.replace(ev, cause=self._with_stderr(ev.cause))
            out.append(ev)
        return out
