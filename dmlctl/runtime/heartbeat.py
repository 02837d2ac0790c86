"""A rank's heartbeat: a daemon thread that records, every few seconds, that the rank
is alive and how far it got (a counter of batches and log calls).

The supervisor calls a rank *hung* when that counter stops moving for the job's
``restart.hang_timeout`` — a rank stuck in a collective keeps beating with the same
counter; a stopped process (SIGSTOP) stops beating. Cheap: one short line per
interval, no synchronisation with training.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dmlctl.protocol import RankEventWriter

INTERVAL_S = 2.0


class Heartbeat:
    """Writes ``progress()`` every ``interval`` seconds until :meth:`stop`."""

    def __init__(
        self, rank_dir: str, rank: int, progress: Callable[[], int], interval: float = INTERVAL_S
    ) -> None:
        self._writer = RankEventWriter(rank_dir, rank)
        self._progress = progress
        self._interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dmlctl-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Beat at once: a rank that stops before its first interval is still watched.
        self._writer.heartbeat(self._progress())
        while not self._done.wait(self._interval):
            self._writer.heartbeat(self._progress())

    def stop(self) -> None:
        self._done.set()
        self._thread.join(self._interval + 1.0)
        self._writer.close()
