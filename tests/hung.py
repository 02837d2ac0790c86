"""What a CLI run that passed its test's timeout was doing, for the failure message.

A test that waits on ``dmlctl launch`` and times out would otherwise say only "timed
out after 120 s". :func:`describe` lists every process of the runs under one
``DMLCTL_HOME`` (their state, CPU time and kernel wait), has each live rank dump
every thread's stack (the rank's own ``faulthandler`` on the stacks signal, as the
host agent does on a hang), adds every thread's native stack where gdb is installed,
and the last lines each rank wrote and the last records it sent. Best effort: it
never raises.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from dmlctl import protocol

_STACK_HEADER = re.compile(rb"^dmlctl: rank \d+ pid (\d+) ", re.MULTILINE)
TAIL_LINES = {".stacks": 60, ".stdout": 20, ".stderr": 20, ".jsonl": 4}
"""How many last lines of each kind of rank file the description shows."""


def describe(home: Path) -> str:
    """Processes, fresh stack dumps and file tails of every run under ``home``."""
    try:
        procs = _processes(home)
        rank_dirs = sorted((home / "runs").glob("*/hosts/*"))
        ranks = _live_ranks(rank_dirs, procs)
        _dump_stacks(ranks, [p for d in rank_dirs for p in d.glob("rank-*.stacks")])
        parts = ["processes (pid ppid state cpu-s wchan threads command):"]
        parts += [f"  {line}" for line in procs.values()] or ["  none"]
        parts += _native_stacks(ranks)
        for rank_dir in rank_dirs:
            for path in sorted(rank_dir.glob("rank-*")):
                lines = TAIL_LINES.get(path.suffix)
                if lines:
                    parts.append(f"--- {path.relative_to(home)} (last {lines} lines)")
                    parts.append(_tail(path, lines))
        return "\n".join(parts)
    except Exception as exc:  # diagnostics must not hide the failure
        return f"(no diagnostics: {exc!r})"


def _processes(home: Path) -> dict[int, str]:
    """pid → one line, for every live process whose environment names ``home``."""
    needle = f"DMLCTL_HOME={home}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            proc = Path("/proc") / entry
            if needle not in proc.joinpath("environ").read_bytes().split(b"\0"):
                continue
            fields = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()
            ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            wchan = proc.joinpath("wchan").read_text() or "-"
            threads = len(os.listdir(proc / "task"))
            cmd = (
                proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
            found[int(entry)] = (
                f"{entry} {fields[1]} {fields[0]} {ticks:.1f} {wchan} {threads} {cmd[:160]}"
            )
        except (OSError, IndexError, ValueError):
            continue
    return found


def _live_ranks(rank_dirs: list[Path], procs: dict[int, str]) -> list[int]:
    """The pids named in the ranks' stacks files that are live processes of this home
    (pids are reused)."""
    return sorted(
        pid
        for rank_dir in rank_dirs
        for path in rank_dir.glob("rank-*.stacks")
        for pid in {int(m) for m in _STACK_HEADER.findall(path.read_bytes())}
        if pid in procs
    )


def _dump_stacks(ranks: list[int], files: list[Path], within: float = 5.0) -> None:
    """Send the stacks signal to every rank in ``ranks``, then wait until each stacks
    file among ``files`` that names one of them has grown (at most ``within``
    seconds: a loaded machine schedules the signalled ranks late)."""
    named = [f for f in files if {int(m) for m in _STACK_HEADER.findall(f.read_bytes())} & {*ranks}]
    before = {f: f.stat().st_size for f in named}
    for pid in ranks:
        os.kill(pid, getattr(signal, protocol.STACKS_SIGNAL))
    deadline = time.monotonic() + within
    while ranks and time.monotonic() < deadline:
        if all(f.stat().st_size > size for f, size in before.items()):
            time.sleep(0.2)  # the dump is written in pieces: let it end
            return
        time.sleep(0.05)


def _native_stacks(ranks: list[int]) -> list[str]:
    """Every thread's native stack of each rank, where gdb is installed (a rank that
    spins inside a C library shows only its Python frame otherwise)."""
    gdb = shutil.which("gdb")
    out = []
    for pid in ranks if gdb else ():
        try:
            proc = subprocess.run(
                [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                capture_output=True,
                text=True,
                timeout=120,  # reading libtorch's symbols takes a while on a loaded host
                stdin=subprocess.DEVNULL,
            )
            lines = proc.stdout.splitlines()
            frames = [ln[:200] for ln in lines if ln.startswith(("#", "Thread "))]
            frames = frames or [f"gdb found no stack: {proc.stderr.strip()[-300:]}"]
        except (OSError, subprocess.TimeoutExpired) as exc:
            frames = [f"gdb failed: {exc}"]
        out += [f"--- native stacks of pid {pid} (gdb)", *frames]
    return out


def _tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
