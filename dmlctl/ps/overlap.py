"""The communication thread of ``overlap: true`` (runtime side, torch-free itself).

The double-buffer scheme of parameter-server systems: while the trainer computes the
next step on its current model, one background thread pushes the previous update and
pulls the newest model; at the next exchange the trainer takes what that thread
pulled and hands it the next update. So the model a worker computes on is one exchange
older than without overlap; what it pushes is the same. :class:`CommThread` is that
thread: at most one job in flight, its result (or its exception) collected by
:meth:`CommThread.wait`.
The thread is a daemon, so a job blocked on a peer that died never keeps the process
from exiting.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


class CommThread:
    """Runs one communication job at a time in the background (module docstring)."""

    def __init__(self, name: str = "dmlctl-comm") -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._pending = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> bool:
        """Whether a job was submitted and its result not collected yet."""
        return self._pending

    @property
    def ready(self) -> bool:
        """Whether the job in flight has ended (:meth:`wait` returns at once)."""
        return self._pending and not self._results.empty()

    def submit(self, job: Callable[[], Any]) -> None:
        """Start ``job`` in the background. Only one job is in flight: collect the
        previous one with :meth:`wait` first."""
        if self._pending:
            raise RuntimeError("a communication job is still in flight; wait() for it first")
        self._pending = True
        self._jobs.put(job)

    def wait(self) -> Any:
        """The result of the job in flight (None when there is none), once it ended;
        an exception it raised is raised here."""
        if not self._pending:
            return None
        ok, value = self._results.get()
        self._pending = False
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Let the thread end once its job (if any) is done; does not wait."""
        self._jobs.put(_STOP)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            try:
                self._results.put((True, job()))
            except BaseException as exc:  # handed to the trainer, raised there
                self._results.put((False, exc))
