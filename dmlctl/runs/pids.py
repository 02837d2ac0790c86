"""A process recorded by dmlctl (a run's controller), known by its pid and its start
time, so that a signal only ever reaches that process and never a stranger that was
given the same pid after it ended.

The start time is field 22 of ``/proc/PID/stat`` (clock ticks after boot): two
processes that hold the same pid one after the other never share it. A signal goes
through a pidfd opened before the start time is compared, so the process checked is
the process signalled even if it ends in between.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot); None when there is no such live
    process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3); the start time is field 22
    return None if fields[0] == "Z" else int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class RecordedProcess:
    """A process as recorded in a run's ``controller.pid``: ``"PID START"``."""

    pid: int
    start: int | None  # None: recorded by a dmlctl that kept the pid alone

    @classmethod
    def of(cls, pid: int) -> RecordedProcess:
        """The live process ``pid``, with its start time read now."""
        return cls(pid, start_ticks(pid))

    @classmethod
    def parse(cls, text: str) -> RecordedProcess | None:
        """The record written by :meth:`dumps`, or a bare pid; None if neither."""
        parts = text.split()
        if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
            return None
        return cls(int(parts[0]), int(parts[1]) if len(parts) == 2 else None)

    def dumps(self) -> str:
        return str(self.pid) if self.start is None else f"{self.pid} {self.start}"

    def alive(self) -> bool:
        """True while the recorded process lives: same pid, same start time. A record
        without a start time counts only a dmlctl process (its command line says so)."""
        start = start_ticks(self.pid)
        if start is None:
            return False
        if self.start is None:
            return "dmlctl" in _cmdline(self.pid)
        return start == self.start

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the recorded process if it still lives; False (and
        nothing sent) when it is gone or its pid now names another process."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:  # no such process
            return False
        try:
            if not self.alive():
                return False
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signum)
            return True
        finally:
            os.close(fd)
