"""The supervisor's stop rules: when an attempt's agents are told to stop, with how
much grace for the ranks, and when they are killed through their transports.

* A **user stop** (Ctrl-C, ``dmlctl stop``, SIGTERM to the controller; :meth:`StopRules.request`)
  sends ``stop <stop_grace>`` to every live agent at once: the ranks get SIGTERM and
  ``stop_grace`` seconds to save and exit. A second request kills the agents at once.
* A **failure** (a root cause in the run state or in the events just read) sends
  ``stop <grace>`` after ``fail_grace`` seconds, so no rank waits forever in a
  collective for a peer that is gone: the grace is ``stop_grace``, at most
  :data:`FAIL_STOP_GRACE`.
* An agent still running ``stop_margin`` seconds past its ranks' grace is killed
  through its transport — unless it is still sending what its ranks wrote (a backlog
  of output is drained, never cut: it is killed once it has been quiet for
  :data:`STREAMING_S`); an agent whose stdin is closed is killed at once.

Thread-safe where it must be: :meth:`StopRules.request` may come from a signal handler
or another thread; everything else runs on the supervisor's loop.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dmlctl.failure import Kind
from dmlctl.runs.events import Event, RankExited, StopRequested
from dmlctl.runs.state import RunState
from dmlctl.transport.base import Process

FAIL_STOP_GRACE = 5.0  # the most seconds the ranks of a failed attempt get after SIGTERM
ENDS = (Kind.ALLOCATION, Kind.REQUEUED)  # root causes whose ranks get all of stop_grace
STOP_MARGIN = 5.0  # seconds past the ranks' grace before an agent is killed
STREAMING_S = 2.0  # an agent that sent output this recently is draining, not stuck


@dataclass
class AttemptStops:
    """Where one attempt is in its stop: when ``stop`` was sent, when the failure stop
    is due, when the agents are to be killed (monotonic seconds, or None)."""

    stop_sent: float | None = None
    fail_stop_at: float | None = None
    kill_at: float | None = None
    data_at: dict[str, float] = field(default_factory=dict)  # host → its last output
    killed: set[str] = field(default_factory=set)  # hosts whose agent was killed


class StopRules:
    """The rules of the module docstring, with their settings."""

    def __init__(self, *, stop_grace: float, fail_grace: float, stop_margin: float) -> None:
        self.stop_grace = stop_grace
        self.fail_grace = fail_grace
        self.stop_margin = stop_margin
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._force = False

    def request(self, reason: str) -> None:
        """Ask the run to stop (thread- and signal-safe). A second request forces."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
            else:
                self._force = True

    @property
    def reason(self) -> str | None:
        """Why the user asked to stop, or None."""
        with self._lock:
            return self._reason

    def apply(
        self,
        stops: AttemptStops,
        procs: Mapping[str, Process],
        live: set[str],
        state: RunState,
        batch: Sequence[Event],
        now: float,
    ) -> list[Event]:
        """Carry out the rules for the agents in ``live``; the events they add."""
        out: list[Event] = []
        with self._lock:
            reason, force = self._reason, self._force
        if reason is not None and stops.stop_sent is None:
            out.append(StopRequested(reason, now))
            stops.stop_sent, stops.kill_at = now, now + self.stop_grace + self.stop_margin
            _send_stop(procs, live, self.stop_grace)
        failed = state.root_cause is not None or any(
            isinstance(ev, RankExited) and ev.cause is not None for ev in batch
        )
        if failed and stops.stop_sent is None:
            if stops.fail_stop_at is None:
                stops.fail_stop_at = now + self.fail_grace
            elif now >= stops.fail_stop_at:
                grace = min(FAIL_STOP_GRACE, self.stop_grace)
                if state.root_cause is not None and state.root_cause.kind in ENDS:
                    grace = self.stop_grace  # the allocation's end is near: time to save
                stops.stop_sent, stops.kill_at = now, now + grace + self.stop_margin
                _send_stop(procs, live, grace)
        if force:
            stops.kill_at = now
        if stops.kill_at is not None and now >= stops.kill_at:
            draining = {
                h for h in live if not force and now - stops.data_at.get(h, -1e9) < STREAMING_S
            }
            for host in live - draining - stops.killed:
                procs[host].kill()
                stops.killed.add(host)
            stops.kill_at = now + 0.5 if draining else None
        return out


def _send_stop(procs: Mapping[str, Process], live: set[str], grace: float) -> None:
    for host in live:
        if not procs[host].send(f"stop {grace:g}"):
            procs[host].kill()
