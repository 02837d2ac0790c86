"""Finding the processes of a run, for no-orphan assertions."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest


def run_processes(run_id: str) -> list[int]:
    """Live, non-zombie processes that belong to ``run_id``: its run id is in their
    environment (every rank and torchrun) or on their command line (the host agent,
    and the zygote of ``ranks: {start: warm}``, forked from it), and the processes those
    started (a warm rank, forked by the zygote, has the zygote's environment)."""
    found: set[int] = set()
    parents: dict[int, int] = {}
    needle_env = f"DMLCTL_RUN_ID={run_id}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            parents[int(entry)] = int(fields[1])
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if needle_env in env.split(b"\0") or run_id.encode() in cmd:
            found.add(int(entry))
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return sorted(found)


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
