"""Stack dumps of a host's rank processes, taken when the controller suspects a hang.

Each rank armed ``faulthandler`` on :data:`dmlctl.protocol.STACKS_SIGNAL` at start
(see :mod:`dmlctl.runtime.entry`): the signal makes it append every thread's Python
stack to ``rank-<R>.stacks``, from a C signal handler, so even a rank whose
interpreter lock is never released answers. A stopped process (SIGSTOP) cannot run
its handler; ``py-spy dump`` reads its stack from outside where py-spy is installed,
otherwise the dump says that the process is stopped.

:func:`dump_stacks` promises: it never signals a process it was not given, waits at
most ``wait`` seconds (plus ``PYSPY_TIMEOUT`` per stopped rank with py-spy), and
returns every rank's new dump lines (an explanation where there is no dump).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping

from dmlctl import protocol
from dmlctl.agent.usage import stat_fields

_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')  # faulthandler
_SPY_FRAME = re.compile(r"^\s+(\S.*) \((.+):(\d+)\)$")  # py-spy: "    step (train.py:88)"
SETTLE_S = 0.2  # a dump file that has not grown for this long is complete
PYSPY_TIMEOUT = 10.0


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``T`` stopped, …) or None if gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> list[str]:
    """The lines written since ``offset``, after the file's first line (the rank's
    own header: pid and main thread id) when there are any."""
    try:
        with open(path, "rb") as f:
            header = f.readline().decode("utf-8", "replace").rstrip("\n")
            f.seek(max(offset, f.tell()))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return [header, *lines] if lines and header.startswith("dmlctl:") else lines


def _pyspy(pid: int) -> list[str] | None:
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            # --nonblocking: the process is stopped already; py-spy cannot suspend it again
            [exe, "dump", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            timeout=PYSPY_TIMEOUT,
            text=True,
            errors="replace",
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"dmlctl: py-spy dump failed: {e}"]
    return (out.stdout + out.stderr).splitlines()


def dump_stacks(
    pids: Mapping[int, int], rank_dir: str, wait: float = 2.0
) -> tuple[dict[int, list[str]], list[int]]:
    """Ask every rank in ``pids`` (rank → pid) for its stacks; returns (rank → dump
    lines, ranks whose process is stopped)."""
    sig = getattr(signal, protocol.STACKS_SIGNAL)
    paths = {r: protocol.rank_stacks(rank_dir, r) for r in pids}
    before = {r: _size(p) for r, p in paths.items()}
    out: dict[int, list[str]] = {}
    stopped: list[int] = []
    asked: list[int] = []
    for rank, pid in sorted(pids.items()):
        state = process_state(pid)
        if state is None or state in "ZX":
            out[rank] = [f"dmlctl: rank {rank} (pid {pid}) has exited: no stack"]
        elif state in "Tt":
            stopped.append(rank)
            found = _pyspy(pid)
            out[rank] = found or [
                f"dmlctl: rank {rank} (pid {pid}) is stopped (state {state}, e.g. SIGSTOP): "
                "it cannot dump its own stack; install py-spy to read it from outside"
            ]
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
            asked.append(rank)
    _settle({r: paths[r] for r in asked}, before, wait)
    for rank in asked:
        lines = _read_from(paths[rank], before[rank])
        out[rank] = lines or [f"dmlctl: rank {rank} wrote no stack within {wait:g} s"]
    return out, stopped


GDB_TIMEOUT = 20.0


def unarmed_ranks(pids: Iterable[int], rank_dir: str, known: Iterable[int]) -> dict[int, int]:
    """The ranks of ``rank_dir`` among processes ``pids`` that have not armed their stack
    dumps yet (not in ``known``: no start record), rank → pid: a process with
    torchrun's ``RANK`` and this rank directory in its environment (a warm rank: named
    ``rank N``), the first of its family (a rank's children inherit its environment)."""
    found: dict[int, int] = {}
    skip = set(known)
    for pid in sorted(pids):
        rank = _rank_of(pid, rank_dir)
        if rank is not None and rank not in skip and rank not in found:
            found[rank] = pid
    return found


def _rank_of(pid: int, rank_dir: str) -> int | None:
    """The rank process ``pid`` runs, where it says so."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(p.split(b"=", 1) for p in f.read().split(b"\0") if b"=" in p)
        with open(f"/proc/{pid}/comm", "rb") as f:
            comm = f.read().decode(errors="replace").strip()
    except OSError:
        return None
    if env.get(b"DMLCTL_RANK_DIR", b"").decode(errors="replace") == rank_dir:
        rank = env.get(b"RANK", b"").decode(errors="replace")
        if rank.isdigit():
            return int(rank)
    if comm.startswith("rank ") and comm[5:].isdigit():
        return int(comm[5:])
    return None


def unarmed_stacks(rank: int, pid: int) -> list[str]:
    """The stacks of a rank that never armed its own dumps, read from outside: Python's
    with py-spy, else every thread's native stack with gdb, else why not."""
    found = _pyspy(pid)
    if found:
        return found
    gdb = shutil.which("gdb")
    head = f"dmlctl: rank {rank} (pid {pid}) never started: "
    if gdb is None:
        return [head + "its stacks cannot be read (install py-spy or gdb to read them)"]
    try:
        out = subprocess.run(
            [gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
            capture_output=True,
            timeout=GDB_TIMEOUT,
            text=True,
            errors="replace",
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [head + f"gdb failed: {e}"]
    frames = [ln for ln in out.stdout.splitlines() if ln.startswith(("#", "Thread "))]
    return [head + "its native stacks (gdb):", *frames] if frames else [head + out.stderr[-300:]]


def _settle(paths: Mapping[int, str], before: Mapping[int, int], wait: float) -> None:
    """Wait until every file grew and then stayed the same for ``SETTLE_S``, or ``wait``."""
    deadline = time.monotonic() + wait
    last = {r: before[r] for r in paths}
    still = {r: time.monotonic() for r in paths}
    while time.monotonic() < deadline:
        now = time.monotonic()
        done = True
        for rank, path in paths.items():
            size = _size(path)
            if size != last[rank]:
                last[rank], still[rank] = size, now
            if size == before[rank] or now - still[rank] < SETTLE_S:
                done = False
        if done:
            return
        time.sleep(0.02)


def main_thread_frames(lines: list[str]) -> list[tuple[str, int, str]]:
    """The main thread's frames in a faulthandler (or ``py-spy dump``) dump, innermost
    first, as (file, line, function); the dump's first thread's when the main one is
    not named."""
    ident = next(
        (ln.rsplit("main thread ", 1)[1].strip() for ln in lines if "main thread 0x" in ln), None
    )
    sections: list[tuple[str, list[tuple[str, int, str]]]] = []
    for ln in lines:
        if ln.startswith(("Thread ", "Current thread 0x")):
            sections.append((ln, []))
        elif sections and (m := _FRAME.match(ln)) is not None:
            sections[-1][1].append((m.group(1), int(m.group(2)), m.group(3).strip()))
        elif sections and (m := _SPY_FRAME.match(ln)) is not None:
            sections[-1][1].append((m.group(2), int(m.group(3)), m.group(1)))
    for header, frames in sections:
        if (ident is not None and ident in header) or '"MainThread"' in header:
            return frames
    return sections[0][1] if sections else []
