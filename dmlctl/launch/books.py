"""Where a run's events go, in order: secrets hidden, the current attempt's own notes
taken (:class:`dmlctl.launch.attempt.AttemptNotes`), reduced into the run state,
recorded in the run directory and shown by the sink.

Not thread-safe, except :meth:`RunBooks.post`: the supervisor's loop owns the rest.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from dmlctl.redact import Redactor
from dmlctl.runs.events import Event
from dmlctl.runs.redaction import redact_events
from dmlctl.runs.reducer import apply
from dmlctl.runs.sink import Sink
from dmlctl.runs.state import RunState
from dmlctl.runs.store import RunDir
from dmlctl.runs.writer import RunWriter


def _no_notes(batch: list[Event]) -> list[Event]:
    return batch


class RunBooks:
    """The run's record keeping: :meth:`fold` is the only way an event reaches the
    state, the run directory and the sink."""

    def __init__(
        self,
        run: RunDir,
        sink: Sink,
        *,
        clock: Callable[[], float] = time.time,
        redactor: Redactor | None = None,
        notes: Callable[[list[Event]], list[Event]] = _no_notes,
    ) -> None:
        self.sink = sink
        #: Hides the run's secrets in everything that comes back (before it is
        #: recorded, reduced or shown).
        self.redactor = redactor or Redactor()
        self.writer = RunWriter(run, clock)
        self._notes = notes
        self._inbox: queue.Queue[Event] = queue.Queue()  # events from other threads

    def fold(self, state: RunState, batch: list[Event]) -> RunState:
        """``state`` with ``batch`` applied; the batch is recorded and shown first. A
        failing store adds its :class:`ControllerFailed` event (which stops the run)."""
        if not batch:
            return state
        batch = self._notes(redact_events(self.redactor, batch))
        state = apply(state, batch)
        failed = self.writer.record(batch)  # a full disk, a deleted run directory
        if failed:
            state = apply(state, failed)
            batch = [*batch, *failed]
        self.sink.on_events(batch, state)
        return state

    def persist(self, state: RunState) -> RunState:
        """Write ``state`` to the run directory (``state.json``); a failed write is
        folded in as above."""
        return self.fold(state, self.writer.state(state))

    def post(self, event: Event) -> None:
        """Hand an event over from another thread (thread-safe)."""
        self._inbox.put(event)

    def take_posted(self) -> list[Event]:
        """The events posted since the last call, oldest first."""
        out: list[Event] = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out
