"""Finding the processes of a run, for no-orphan assertions."""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Proc:
    """One live, non-zombie process as ``/proc`` shows it."""

    pid: int
    parent: int
    env: list[bytes]
    cmd: bytes


def processes() -> dict[int, Proc]:
    """Every live, non-zombie process this one may read, by pid."""
    found: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if fields[0] != b"Z":
            found[int(entry)] = Proc(int(entry), int(fields[1]), env, cmd)
    return found


def run_processes(run_id: str) -> list[int]:
    """Live, non-zombie processes that belong to ``run_id``: its run id is in their
    environment (every rank and torchrun) or on their command line (the host agent,
    and the zygote of ``ranks: {start: warm}``, forked from it), and the processes those
    started (a warm rank, forked by the zygote, has the zygote's environment)."""
    table = processes()
    needle_env = f"DMLCTL_RUN_ID={run_id}".encode()
    found = {p.pid for p in table.values() if needle_env in p.env or run_id.encode() in p.cmd}
    grew = True
    while grew:
        more = {p.pid for p in table.values() if p.parent in found} - found
        found |= more
        grew = bool(more)
    return sorted(found)


def leftovers(root: str) -> list[int]:
    """Processes (not this one nor its ancestors) whose command line names ``root`` or
    whose ``DMLCTL_HOME`` lies under it: what a test session under ``root`` left."""
    table = processes()
    mine, pid = set(), os.getpid()
    while pid in table and pid not in mine:
        mine.add(pid)
        pid = table[pid].parent
    needle, home = root.encode(), b"DMLCTL_HOME=" + root.encode()
    return [
        p.pid
        for p in table.values()
        if p.pid not in mine and (needle in p.cmd or any(v.startswith(home) for v in p.env))
    ]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    """Process ``pid``'s command line, arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parent(pid: int) -> int:
    """Process ``pid``'s parent pid (OSError once it is gone)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def wait_until(predicate: object, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]


def agent_pid(proc: subprocess.Popen[str], host: str = "local") -> tuple[int, list[str]]:
    """The pid ``dmlctl launch --ui plain`` (``proc``, stdout piped) says the agent on
    ``host`` has, and the lines read up to that one; fails the test if none comes."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if m := re.search(rf"agent started on {re.escape(host)} \(pid (\d+)\)", line):
            return int(m.group(1)), seen
    pytest.fail("no agent started:\n" + "".join(seen))
