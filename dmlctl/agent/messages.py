"""What a host agent says to its controller and hears from it: the JSON lines on
its stdout (:class:`Emitter`), torchrun's own output forwarded (:func:`forward_torchrun`,
:class:`Output`), and the commands on its stdin (:class:`Commands`, :func:`watch_stdin`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import sys
import threading
from typing import TextIO

from dmlctl import torchrun_report, wire
from dmlctl.agent.procs import alive

TAIL = 40  # torchrun's last lines, in the exit message
SUMMARY_LINES = 2000  # at most this much of torchrun's failure summary


class Emitter:
    """Thread-safe writer of agent messages; notes when the controller is gone."""

    def __init__(self, out: TextIO, gone: threading.Event) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._gone = gone

    def raw(self, line: str) -> None:
        with self._lock:
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._gone.set()

    def send(self, msg: wire.Message) -> None:
        self.raw(wire.encode(msg))


_REPORT_START = re.compile(r"failed \(exitcode: -?\d+\)|Sending process \d+ closing signal")
"""A line of torchrun's that starts its report of a failed worker (sent as the
``torchrun`` stream: logged, not shown)."""


def forward_torchrun(
    stream: TextIO,
    emit: Emitter,
    tail: collections.deque[str],
    stop: threading.Event,
    summary: collections.deque[str] | None = None,
) -> None:
    source = "agent"
    for line in stream:
        text = line.rstrip("\n")
        tail.append(text)
        if summary is not None and torchrun_report.is_failure_summary_line(text):
            summary.append(text)
        if _REPORT_START.search(text):
            source = "torchrun"  # from here on: its report of a failed worker
        # Once we stop torchrun ourselves, what it prints is its own shutdown noise
        # (a SignalException traceback): kept in the exit message's tail, not streamed.
        if not stop.is_set():
            emit.send(wire.LogMsg(None, source, (text,)))


class Output:
    """What torchrun printed, kept for the ``exit`` message: its last lines, and its
    failure summary ("rank : N" / "exitcode : X" per failed rank), which can start far
    above the tail when other ranks' tracebacks follow it."""

    def __init__(self) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL)
        self.summary: collections.deque[str] = collections.deque(maxlen=SUMMARY_LINES)


class Commands:
    """What the controller asked for on stdin (set by :func:`watch_stdin`)."""

    def __init__(
        self,
        stop: threading.Event,
        reason: list[str],
        parent: int | None,
        starter: int | None = None,
    ) -> None:
        self.stop = stop
        self.reason = reason
        self.parent = parent  # the parent pid whose change means the controller is gone
        self.starter = starter  # a process whose end means the same (None: none)
        self.grace: float | None = None  # seconds the stop gives the ranks
        self.dump = threading.Event()

    def controller_gone(self) -> bool:
        """Whether a process standing for the controller's connection ended: the
        agent's parent (sshd's session) or its served starter."""
        if self.parent is not None and os.getppid() != self.parent:
            return True
        return self.starter is not None and not alive(self.starter)


def watch_stdin(commands: Commands) -> None:
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["dump"]:
            commands.dump.set()
        elif words[:1] == ["stop"]:
            with contextlib.suppress(ValueError, IndexError):
                commands.grace = max(0.0, float(words[1]))
            commands.reason.append("stop requested")
            commands.stop.set()
    commands.reason.append("controller connection closed")
    commands.stop.set()
