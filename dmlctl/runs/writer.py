"""The supervisor's writes to the run directory, and what a failing store means.

Promises of :class:`RunWriter`:

* while the run runs, :data:`~dmlctl.runs.files.RESERVE_BYTES` are kept aside in the
  run directory: on a full disk the final state is written into them, and the
  summary is a hard link to it (no free space needed);
* a write that fails never raises: the first failure becomes one
  :class:`ControllerFailed` event (``DiskFull`` naming the path, ``RunDirGone``,
  ``StoreError``), which makes it the run's root cause and stops the run. After a
  full disk, logs and metrics are no longer appended (states are still tried, the
  final one is kept in the reserve); after the directory is gone nothing more is
  written;
* :meth:`check` notices within :data:`CHECK_S` seconds that the run directory was
  deleted, even while no write is due (an open log file outlives its directory).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from dmlctl.failure import CONTROLLER, Evidence, Failure, Kind
from dmlctl.runs.events import ControllerFailed, Event
from dmlctl.runs.files import DiskFull, RunDirGone, StoreError, store_error
from dmlctl.runs.recorder import RunRecorder
from dmlctl.runs.state import RunState
from dmlctl.runs.store import RunDir

CHECK_S = 1.0


class RunWriter:
    """See the module docstring. Not thread-safe: the supervisor's loop owns it."""

    def __init__(self, run: RunDir, clock: Callable[[], float] = time.time) -> None:
        self.run = run
        self.clock = clock
        self.recorder = RunRecorder(run)
        self.failure: StoreError | None = None
        self._checked = 0.0

    def start(self) -> list[Event]:
        """Take the reserve; a full disk already is a failure before anything starts."""
        try:
            self.run.check_present()
            self.run.reserve.take()
        except OSError as e:
            return self._failed(store_error(e, self.run.reserve.path, self.run.path))
        except StoreError as e:
            return self._failed(e)
        return []

    def record(self, batch: Sequence[Event]) -> list[Event]:
        """Append ``batch``'s lines and records; a failure's event, or nothing."""
        if self.failure is not None:
            return []
        try:
            self.recorder.record(batch)
            self.recorder.flush()
        except StoreError as e:
            return self._failed(e)
        return []

    def state(self, state: RunState) -> list[Event]:
        """Persist ``state`` (still tried after a full disk: space may come back)."""
        if isinstance(self.failure, RunDirGone):
            return []
        try:
            self.run.check_present()  # never into a directory made again by another
            self.run.write_state(state)
        except StoreError as e:
            return self._failed(e) if self.failure is None else []
        return []

    def check(self, *, now: bool = False) -> list[Event]:
        """At most every :data:`CHECK_S` seconds (or ``now``): is the run directory
        still there?"""
        clock = time.monotonic()
        if self.failure is not None or (not now and clock - self._checked < CHECK_S):
            return []
        self._checked = clock
        try:
            self.run.check_present()
        except RunDirGone as e:
            return self._failed(e)
        return []

    def finish(self, state: RunState) -> str | None:
        """Write the final state and summary; None, or why they could not be written.
        On a full disk they go into the reserve's blocks (see the module docstring)."""
        self.recorder.close()
        try:
            if isinstance(self.failure, RunDirGone):
                return str(self.failure)
            try:
                self.run.check_present()
                self.run.write_state(state)
                self.run.write_summary(state)
            except DiskFull:
                self.run.write_final_in_reserve(state)
        except StoreError as e:
            return str(e)
        finally:
            self.run.reserve.release()
        return None

    def _failed(self, error: StoreError) -> list[Event]:
        if self.failure is not None:
            return []
        self.failure = error
        if isinstance(error, DiskFull | RunDirGone):
            self.recorder.close()  # nothing more can be appended
        now = self.clock()
        kind = Kind.DISK_FULL if isinstance(error, DiskFull) else Kind.RECORDS
        cause = Failure(
            CONTROLLER, None, error.kind, str(error), (), now, kind=kind, evidence=Evidence.SEEN
        )
        return [ControllerFailed(cause, now)]
