"""CPU time of a process and its children, to tell a busy rank from an idle one
(torch-free, standard library only)."""

from __future__ import annotations

import os
import time

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAX_DEPTH = 4  # children of children …: compile workers, data loader workers


def _stat(pid: int) -> list[str] | None:
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


def _tree_ticks(pid: int, depth: int) -> int:
    fields = _stat(pid)
    if fields is None or len(fields) < 15:
        return 0
    # utime, stime, cutime, cstime: the process and the children it already waited for
    ticks = sum(int(x) for x in fields[11:15])
    if depth > 0:
        ticks += sum(_tree_ticks(child, depth - 1) for child in _children(pid))
    return ticks


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by ``pid`` (default: this process), its
    live descendants (up to :data:`MAX_DEPTH` levels) and the children already
    reaped. Without ``/proc``: this process and its reaped children only."""
    pid = os.getpid() if pid is None else pid
    if os.path.isdir(f"/proc/{pid}"):
        return _tree_ticks(pid, MAX_DEPTH) / _TICKS
    t = os.times()
    return time.process_time() + t.children_user + t.children_system
