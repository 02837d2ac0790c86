"""What a parameter server reports about its traffic (pure: no torch).

:class:`ServerStats` counts pushes, pulls, their payload bytes and the staleness of
every applied update; :meth:`ServerStats.window` returns rates and staleness
quantiles since its previous call (the server logs them as metrics, which the
dashboard shows on the server's row).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


class ServerStats:
    """Counters of one server; ``clock`` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._pushes = self._pulls = self._push_bytes = self._pull_bytes = 0
        self._staleness: list[int] = []
        self.total_pushes = self.total_pulls = 0

    def pushed(self, nbytes: int, staleness: int) -> None:
        """One applied update of ``nbytes`` payload bytes with measured ``staleness``."""
        self._pushes += 1
        self.total_pushes += 1
        self._push_bytes += nbytes
        self._staleness.append(staleness)

    def pulled(self, nbytes: int) -> None:
        """One answered read of ``nbytes`` payload bytes."""
        self._pulls += 1
        self.total_pulls += 1
        self._pull_bytes += nbytes

    def elapsed(self) -> float:
        """Seconds since the window started."""
        return self._clock() - self._start

    def window(self) -> dict[str, float]:
        """Rates (per second) and staleness median/max since the previous call; then
        a new window starts. Staleness keys are absent when nothing was applied."""
        wall = max(self.elapsed(), 1e-9)
        out = {
            "push_per_s": self._pushes / wall,
            "pull_per_s": self._pulls / wall,
            "push_bytes_per_s": self._push_bytes / wall,
            "pull_bytes_per_s": self._pull_bytes / wall,
        }
        if self._staleness:
            out["staleness_median"] = float(statistics.median(self._staleness))
            out["staleness_max"] = float(max(self._staleness))
        self._start = self._clock()
        self._pushes = self._pulls = self._push_bytes = self._pull_bytes = 0
        self._staleness = []
        return out
