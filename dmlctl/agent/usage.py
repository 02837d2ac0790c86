"""What a process tree is doing, from ``/proc`` (standard library only): its state,
the CPU seconds and the I/O bytes it used so far. The host agent samples every rank
once a second; the controller tells a busy rank (computing, reading, writing) from
an idle one (waiting on a lock, stopped) by the rates."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAX_DEPTH = 4  # children of children …: compile workers, data loader workers


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _io(pid: int) -> int:
    """Bytes ``pid`` read and wrote through system calls (files, pipes, sockets)."""
    total = 0
    try:
        with open(f"/proc/{pid}/io", encoding="ascii") as f:
            for line in f:
                if line.startswith(("rchar:", "wchar:")):
                    total += int(line.split()[1])
    except (OSError, ValueError):
        pass
    return total


def _tree(pid: int, depth: int) -> tuple[int, int]:
    """(CPU ticks, I/O bytes) of ``pid`` and its descendants."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 15:
        return 0, 0
    # utime, stime, cutime, cstime: the process and the children it already waited for
    ticks, io = sum(int(x) for x in fields[11:15]), _io(pid)
    if depth > 0:
        for child in _children(pid):
            t, b = _tree(child, depth - 1)
            ticks, io = ticks + t, io + b
    return ticks, io


def usage(pid: int) -> tuple[str, float, int] | None:
    """``(state letter, CPU seconds, I/O bytes)`` of ``pid`` with its live descendants
    (up to :data:`MAX_DEPTH` levels) and the children it reaped; None once it is gone.
    State letters as ``ps`` shows them: ``R`` running, ``S`` sleeping, ``T`` stopped."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    ticks, io = _tree(pid, MAX_DEPTH)
    return fields[0], ticks / _TICKS, io
