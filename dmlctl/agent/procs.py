"""Process ownership for the host agent: subreaper, descendant walk, tree kill.

torchrun starts every worker in a session of its own, so a process-group kill does
not reach them. The agent therefore makes itself a *child subreaper* (orphans of its
tree are re-parented to it, not to init) and kills by walking its descendants in
``/proc``. Nothing is ever killed by name pattern: only processes in this agent's tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); False elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int, parent: int) -> bool:
    """Have the kernel send ``sig`` to this process when its parent ends (Linux), and
    send it now if the parent is no longer ``parent`` (it ended before this call).
    False where the kernel offers no such signal (then nothing is set)."""
    return dies_with_parent(sig, parent)()


def dies_with_parent(sig: int, parent: int) -> Callable[[], bool]:
    """:func:`die_with_parent` as a function that loads nothing when called: safe
    between ``fork`` and ``exec`` (``subprocess.Popen``'s ``preexec_fn``)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: False

    def arm() -> bool:
        if int(prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)) != 0:
            return False
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)
        return True

    return arm


def name_process(name: bytes) -> None:
    """Set this process's short name (``ps -o comm``, ``top``): a forked process keeps
    the command line of the one it was forked from."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name[:15], 0, 0, 0)


def set_cmdline(argv: list[str]) -> bool:
    """Show ``argv`` as this process's command line (``/proc/PID/cmdline``, ``ps``), by
    writing it over the memory the kernel reads it from; the rest of that memory is
    zeroed. False (nothing changed) where that memory cannot be found or is shorter.

    For a process forked from another one (which keeps the command line of the one it
    was forked from): the arguments Python parsed are copies, so nothing reads them."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (48, 49)
    except (OSError, IndexError, ValueError):
        return False
    data = b"\0".join(a.encode(errors="replace") for a in argv) + b"\0"
    if start <= 0 or len(data) > end - start:
        return False
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    return True


def exit_status(pid: int) -> int | None:
    """Child ``pid``'s exit code once it has ended (it is reaped; ``-N``: killed by
    signal N), else None."""
    got, status = os.waitpid(pid, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if got == pid else None


def _stat(pid: str) -> tuple[str, int] | None:
    """``(state letter, ppid)`` of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (fields[0], int(fields[1])) if len(fields) > 1 else None


def _processes() -> dict[int, tuple[str, int]]:
    """pid → (state, ppid) of every process."""
    out: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(entry)) is not None:
            out[int(entry)] = st
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an exited one not yet reaped does not)."""
    st = _stat(str(pid))
    return st is not None and st[0] != "Z"


def descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (not ``root`` itself), parents before children."""
    children: dict[int, list[int]] = {}
    for pid, (state, ppid) in _processes().items():
        if state != "Z":
            children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def reap(keep: frozenset[int] = frozenset()) -> None:
    """Collect exited children of this process (as a subreaper, orphans end up here),
    except ``keep``: a child whose exit status its owner still wants (torchrun)."""
    me = os.getpid()
    for pid, (state, ppid) in _processes().items():
        if ppid == me and state == "Z" and pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def kill_tree(root: int, grace: float, keep: frozenset[int] = frozenset()) -> None:
    """SIGTERM every descendant of ``root``, wait up to ``grace`` seconds, then SIGKILL
    whatever is left; returns when none is left (or after a further 5 s). Children in
    ``keep`` are signalled but not reaped, so their owner can read their exit status."""
    signal_all(descendants(root), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        reap(keep)
        if not descendants(root):
            return
        time.sleep(0.05)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        left = descendants(root)
        if not left:
            return
        signal_all(left, signal.SIGKILL)
        reap(keep)
        time.sleep(0.05)


def end_forked(body: Callable[[], int]) -> NoReturn:
    """Run ``body`` in a forked child and end the process with the code it returns:
    anything it raises is printed (code 1), stdout and stderr are flushed, and no
    interpreter teardown runs (``os._exit``: the parent's exit handlers are not the
    child's)."""
    code = 1
    try:
        code = body()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
