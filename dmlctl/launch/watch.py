"""Liveness of an attempt, seen from the controller: ranks that stop making progress
(hangs) and hosts that stop sending anything (cut off).

Both use the controller's own clocks only, so clock skew between hosts never counts:
a rank's heartbeat is dated when it arrives, and a host's silence is measured since
its last line arrived.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from dmlctl.launch.events import Event, RankExited, RootCause
from dmlctl.launch.state import RankStatus, RunState


class Liveness:
    """Per attempt: call :meth:`reset` when it starts, :meth:`heard` for every line
    from a host, :meth:`progress` for every heartbeat; :meth:`hung` and
    :meth:`silent` say who stopped. ``None`` timeouts turn a check off."""

    def __init__(
        self,
        hang_timeout: float | None,
        host_timeout: float | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.hang_timeout = hang_timeout
        self.host_timeout = host_timeout
        self.clock = clock
        # rank → (last progress value, when it last changed, already reported as hung)
        self._progress: dict[int, tuple[int, float, bool]] = {}
        self._last_seen: dict[str, float] = {}  # host → monotonic time of its last line

    def reset(self, hosts: Iterable[str]) -> None:
        """A new attempt starts on ``hosts``: no progress seen yet, every host heard now."""
        self._progress = {}
        self._last_seen = dict.fromkeys(hosts, time.monotonic())

    def heard(self, host: str) -> None:
        """A line arrived from ``host``."""
        self._last_seen[host] = time.monotonic()

    def progress(self, rank: int, value: int) -> None:
        """Rank ``rank`` reported progress ``value`` (a growing counter)."""
        seen = self._progress.get(rank)
        if seen is None or seen[0] != value:
            self._progress[rank] = (value, self.clock(), False)

    def silent(self, hosts: Iterable[str]) -> list[str]:
        """Hosts among ``hosts`` that sent nothing for ``host_timeout`` seconds."""
        if self.host_timeout is None:
            return []
        now = time.monotonic()
        limit = self.host_timeout
        return [h for h in sorted(hosts) if now - self._last_seen.get(h, now) > limit]

    def hung(self, state: RunState, now: float) -> list[Event]:
        """A RankExited with a ``Hang`` cause for every running rank whose progress
        has not moved for ``hang_timeout`` seconds (only ranks that send heartbeats);
        each rank is reported once."""
        if self.hang_timeout is None:
            return []
        out: list[Event] = []
        for r in state.ranks:
            seen = self._progress.get(r.rank)
            if r.status != RankStatus.RUNNING or seen is None or seen[2]:
                continue
            idle = now - seen[1]
            if idle >= self.hang_timeout:
                msg = f"no progress for {idle:.0f} s (step {r.step if r.step is not None else '-'})"
                cause = RootCause(r.host, r.rank, "Hang", msg, (), now)
                out.append(RankExited(r.host, r.rank, -1, cause, now))
                self._progress[r.rank] = (seen[0], seen[1], True)
        return out
