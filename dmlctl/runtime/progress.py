"""What a rank's training loop is doing, for the hang detector (torch-free, no I/O).

One :class:`Tracker` per process (:data:`TRACKER`). The runtime feeds it: every batch
:meth:`Context.shard` yields and every ``ctx.log`` call is a :meth:`~Tracker.step`;
the end of the data is :meth:`~Tracker.data_end`; ``ctx.phase(...)``,
checkpoints and the end of the script are phases. The heartbeat thread reads
:meth:`~Tracker.snapshot` once a second.

Promises:

* **Armed only while training steps run.** ``armed`` turns true at the first step
  and false while a phase is open, after the data is exhausted (until the next batch)
  and on a parameter-server rank; so data preparation before the first batch, an
  evaluation after the last one or a declared phase never count as a hang.
* **Idle time.** ``since`` is the seconds since the last step (absent before the first
  and after the data ended).
* **Step time.** ``step_s`` is the slowest of the last :data:`RECENT_STEPS` intervals
  between consecutive steps while armed; the time spent in a phase is not part of
  any interval.
* **Phases nest.** The innermost open phase is reported, with its own limit and age.

Updates are plain attribute writes from the training thread; the heartbeat thread
only reads them, so a snapshot may be a step old, never torn in a way that matters.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

RECENT_STEPS = 50


@dataclass(frozen=True)
class _Phase:
    name: str
    limit: float | None
    since: float


class Tracker:
    """Progress, phases and step times of this process (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.progress = 0
        self._started = False
        self._data_ended = False
        self._server = False
        self._phases: list[_Phase] = []
        self._last_step: float | None = None
        self._intervals: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)

    def step(self, batch: bool = False) -> None:
        """One unit of training progress: a ``log`` call, or with ``batch`` a batch of
        the data iterator (only a batch re-arms after the data ended: a ``log`` call
        of a final evaluation is no training step)."""
        now = self._clock()
        if self.armed and self._last_step is not None:
            self._intervals.append(now - self._last_step)
        self.progress += 1
        self._started = True
        if batch:
            self._data_ended = False
        if self.armed:
            self._last_step = now

    def data_end(self) -> None:
        """The data iterator is exhausted (or was closed): no steps expected now."""
        self._data_ended = True
        self._last_step = None

    def serving(self) -> None:
        """This rank is a parameter server: it waits for workers by design."""
        self._server = True

    @contextlib.contextmanager
    def phase(self, name: str, limit: float | None = None) -> Iterator[None]:
        """A long non-step stretch (evaluation, checkpoint, compilation): no hang
        verdict for lack of steps inside it, unless it runs past ``limit`` seconds."""
        if limit is not None and not limit > 0:
            raise ValueError(f"phase {name!r}: limit must be > 0 seconds, got {limit!r}")
        entry = _Phase(str(name), limit, self._clock())
        self._phases.append(entry)
        try:
            yield
        finally:
            self._phases.remove(entry)
            if self._last_step is not None:
                self._last_step = self._clock()  # the phase is no part of a step

    @property
    def is_server(self) -> bool:
        """Whether this rank is a parameter server (:meth:`serving`)."""
        return self._server

    @property
    def armed(self) -> bool:
        """Whether training steps are under way (see the module promises)."""
        return self._started and not self._data_ended and not self._phases and not self._server

    def snapshot(self) -> dict[str, Any]:
        """The heartbeat's view: progress, armed, step_s and the innermost phase."""
        out: dict[str, Any] = {"progress": self.progress, "armed": self.armed}
        if self._last_step is not None:
            out["since"] = round(self._clock() - self._last_step, 3)
        if self._intervals:
            out["step_s"] = round(max(self._intervals), 4)
        if self._phases:
            current = self._phases[-1]
            out["phase"] = current.name
            out["phase_s"] = round(self._clock() - current.since, 3)
            if current.limit is not None:
                out["limit"] = current.limit
        return out


TRACKER = Tracker()
"""This process's tracker."""
