"""torchrun imported ahead of time by the host agent, forked when the run needs it.

The largest fixed cost of starting torchrun is a new interpreter importing torch
(about 1 s of CPU). The host agent imports ``torch.distributed.run`` before it reads
its configuration, then forks: the child runs torchrun's ``main`` with the attempt's
arguments, environment and directory — the same program as ``python -m
torch.distributed.run`` — and ends with ``os._exit`` after the exit handlers, so no
interpreter teardown delays the report of a failure. For a first attempt that costs
what a new torchrun would; for a restart the controller starts the next agent while
the current attempt runs (a *standby*), and the restart skips the start-up. Anything
that fails here falls back to the cold path (a new process).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NoReturn

from dmlctl.agent import forked_rank  # its snapshot of the environment: the agent's own
from dmlctl.agent.procs import die_with_parent, end_forked, exit_status, name_process
from dmlctl.agent_config import TORCHRUN_MODULE

TORCHRUN = ("-m", TORCHRUN_MODULE)
STANDIN = ("-m", "dmlctl.agent.standin")


def preload() -> bool:
    """Import torchrun now, and what every rank will import in any case; False (and
    nothing raised) when torchrun cannot be imported.

    That is ``torch._dynamo``: torch's optimizers import it when they are made, and
    so does DDP (about 1 s of CPU). Imported here, once, every rank forked from this
    process has it; for a standby agent it is done before the failure it stands by
    for."""
    try:
        import torch.distributed.run
    except Exception:
        return False
    before = dict(os.environ)
    with contextlib.suppress(Exception):  # the ranks meet the error themselves
        import torch._dynamo  # noqa: F401
    # What the import set in the environment (inductor's cache directory) is what a
    # rank's own import would set: the ranks may still be forked.
    forked_rank.adopt_environment({k: v for k, v in os.environ.items() if before.get(k) != v})
    return True


NATIVE_EXIT_WAIT_S = 60.0
"""The longest the agent waits for a joined thread's native exit before it forks."""


def await_preload(
    preload: threading.Thread, interval: float, keepalive: Callable[[], None]
) -> None:
    """Wait for the ``preload`` thread to end, calling ``keepalive`` every ``interval``
    seconds meanwhile: importing torch takes many seconds on a loaded host.

    Ended means gone from the kernel too, not only joined: after ``join`` returns the
    thread still runs its native exit (thread-local destructors). The thread that
    imported torch holds MKL per-thread state, which MKL releases there under a
    spinlock; a fork in that window copies the lock held, and every rank forked from
    the child then spins forever in its first matrix product."""
    while preload.is_alive():
        preload.join(interval)
        if preload.is_alive():
            keepalive()
    task = f"/proc/self/task/{preload.native_id}"  # absent without /proc: no wait
    deadline = time.monotonic() + NATIVE_EXIT_WAIT_S
    beat = time.monotonic() + interval
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.001)
        if time.monotonic() >= beat:
            keepalive()
            beat += interval


def can_fork(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is ``<this python> -m dmlctl.agent.torchrun …`` or ``<this
    python> -m dmlctl.agent.standin`` (what a warm agent can run in a forked child,
    torchrun being imported)."""
    return (
        ((len(argv) > 3 and tuple(argv[1:3]) == TORCHRUN) or tuple(argv[1:]) == STANDIN)
        and os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
        and "torch.distributed.run" in sys.modules
    )


class ForkedTorchrun:
    """torchrun in a child forked from this process, with the part of
    :class:`subprocess.Popen` the agent uses: ``pid``, ``stdout`` (text, torchrun's
    stdout and stderr together), ``poll``, ``wait`` and ``returncode``."""

    def __init__(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> None:
        read, write = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
            stream.flush()
        agent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which never returns
            os.close(read)
            _child(list(argv), cwd, env, write, agent)
        os.close(write)
        self.pid = pid
        self.returncode: int | None = None
        self.stdout: IO[str] = os.fdopen(read, "r", errors="replace")

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                return None
            time.sleep(0.02)
        return self.returncode


_kept: list[Any] = []  # the parent's stdio objects, kept so their buffers never flush


def _child(argv: list[str], cwd: str, env: Mapping[str, str], out: int, agent: int) -> NoReturn:
    """Become ``python -m dmlctl.agent.torchrun argv[3:]`` in ``cwd`` with ``env``; a
    SIGKILL when the ``agent`` ends (its ranks follow: see ``runtime.entry``)."""
    end_forked(lambda: _torchrun(argv, cwd, env, out, agent))


def _torchrun(argv: list[str], cwd: str, env: Mapping[str, str], out: int, agent: int) -> int:
    """:func:`_child`'s work; its exit code."""
    name_process(b"torchrun")
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent(signal.SIGKILL, agent)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    _kept.extend((sys.stdin, sys.stdout, sys.stderr))
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the child's own stdio
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["torch.distributed.run", *argv[3:]]
    code = 1
    try:
        if tuple(argv[1:]) == STANDIN:  # a lost host's ranks, forked from here
            from dmlctl.agent import standin

            raise SystemExit(standin.main(fork=True))
        # torchrun's own entry point, called: running the module again with runpy
        # would warn that it is already in sys.modules.
        from dmlctl.agent import torchrun

        with contextlib.suppress(Exception):  # else they start as new interpreters
            forked_rank.install()  # its ranks forked from here too
        torchrun.run(argv[3:])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    atexit._run_exitfuncs()
    return code
