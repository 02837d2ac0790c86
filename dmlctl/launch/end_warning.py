"""The warning before a Slurm allocation's time limit (``slurm.warn_before_end``).

A thread asks Slurm how long the run's allocation has left, every
:data:`POLL_S` seconds (sooner when the warning is nearer). Once it is no more than
``warn_s``, it posts the allocation's end as the run's root cause, once per Slurm
job: the ranks get SIGTERM and all of ``restart.stop_grace`` to save, and then, with
``slurm.requeue``, the run asks for a new allocation at once (the old one is
cancelled); without it, the run ends there. A Slurm that does not answer is asked
again at the next poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dmlctl.failure import Kind
from dmlctl.launch.requeue import Reallocation, allocation_end
from dmlctl.runs.events import Event
from dmlctl.slurm import allocation
from dmlctl.slurm.allocation import Allocation
from dmlctl.slurm.commands import SlurmError
from dmlctl.slurm.info import seconds_until

POLL_S = 10.0
"""The longest wait between two looks at the time left."""


def time_left(where: Allocation) -> float | None:
    """Seconds ``where`` has left now, until its end time (None: no limit, or Slurm
    does not say)."""
    try:
        now = allocation.state(where.job_id, where.conf)
    except SlurmError:
        return None
    return seconds_until(now.end_time, time.time()) if now.state == "RUNNING" else None


class EndWarning:
    """Watches the allocation of ``realloc`` (see the module docstring); ``post``
    hands an event to the run's supervisor (any thread)."""

    def __init__(
        self,
        realloc: Reallocation,
        post: Callable[[Event], None],
        left: Callable[[Allocation], float | None] = time_left,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.realloc, self.post, self.left, self.clock = realloc, post, left, clock
        self._stop = threading.Event()

    def check(self) -> float:
        """One look: post the end when it is due (once per job); the seconds until
        the next look."""
        where = self.realloc.where
        left = self.left(where) if self.realloc.warned != where.job_id else None
        if left is None:
            return POLL_S
        if left > where.warn_s:
            return max(1.0, min(POLL_S, (left - where.warn_s) / 2))
        self.realloc.warned = where.job_id
        kind = Kind.REQUEUED if where.requeue else Kind.ALLOCATION
        then = "a new allocation is asked for (slurm.requeue)" if where.requeue else "no restart"
        why = (
            f"Slurm job {where.job_id} reaches its time limit in {left:.0f} s "
            f"(slurm.warn_before_end: {where.warn_s:g}): its ranks were stopped to save; {then}"
        )
        self.post(allocation_end(kind, why, self.clock()))
        return POLL_S

    def start(self) -> EndWarning:
        """Look in a daemon thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(self.check()):
                pass

        threading.Thread(target=loop, name="dmlctl-end-warning", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
