"""Host agents on this machine from the agent server (:mod:`dmlctl.agent.server`).

:func:`start_agent` asks the server that matches this controller (same user,
interpreter, start-up environment and dmlctl; :mod:`dmlctl.agent.ask`) for a host
agent on three pipes of the controller's, and returns it as a :class:`WarmProcess` —
or None, and then the caller starts ``python -m dmlctl.agent`` as before.
:func:`served` is the command line that does the same on a remote host
(:mod:`dmlctl.agent.served`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence

from dmlctl.agent import ask
from dmlctl.agent.procs import descendants, signal_all
from dmlctl.transport.pipes import Pipes, text_end

SERVED = ("-m", "dmlctl.agent.served")


def served(argv: Sequence[str]) -> list[str]:
    """``argv`` as a remote host runs it: a host agent (``<python> -m dmlctl.agent
    …``) becomes ``<python> -m dmlctl.agent.served …``, which takes it from that host's
    agent server where one matches; anything else is left as it is."""
    if len(argv) >= 3 and tuple(argv[1:3]) == ask.AGENT:
        return [argv[0], *SERVED, *argv[3:]]
    return list(argv)


def start_agent(
    host: str, argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None = None
) -> WarmProcess | None:
    """``argv`` (a host agent) forked by the matching server, or None (module doc)."""
    env = dict(os.environ if env is None else env)
    try:
        return _start_agent(host, argv, cwd, env)
    except (OSError, ValueError):  # a file gone while keyed, this directory gone, …
        return None


def _start_agent(
    host: str, argv: Sequence[str], cwd: str | None, env: Mapping[str, str]
) -> WarmProcess | None:
    """Ask with the agent's ends of three pipes; None if no server or no pid came."""
    conn = ask.connect(argv, env)
    if conn is None:
        return None
    ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
    theirs = [ends[0][0], ends[1][1], ends[2][1]]
    ours = [ends[0][1], ends[1][0], ends[2][0]]
    try:
        pid = ask.request(conn, argv, cwd or os.getcwd(), env, theirs)
    except OSError:
        for fd in ours:
            os.close(fd)
        conn.close()
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    if pid is None:
        for fd in ours:  # an agent forked late reads the end of stdin and exits
            os.close(fd)
        return None
    return WarmProcess(host, conn, pid, ours)


class WarmProcess(Pipes):
    """A host agent forked by the server: a :class:`~dmlctl.transport.base.Process`
    whose exit code comes over the server's connection."""

    def __init__(self, host: str, conn: socket.socket, pid: int, ends: Sequence[int]) -> None:
        stdin, stdout, stderr = ends
        super().__init__(host, text_end(stdin, "w"), text_end(stdout, "r"), text_end(stderr, "r"))
        self.pid = pid
        self._conn = conn
        self._code: int | None = None
        self._over = threading.Event()  # the exit code came, or the server is gone
        threading.Thread(target=self._await_exit, daemon=True).start()

    def _await_exit(self) -> None:
        self._code = ask.exit_code(self._conn)
        self._over.set()

    def _ended(self) -> bool:
        if self._code is not None:
            return True
        if not self._over.is_set():
            return False
        if ask.running(self.pid):  # the server is gone: the agent, not its code, is seen
            return False
        self._code = 1
        return True

    def wait(self, timeout: float | None = None) -> int | None:
        end = None if timeout is None else time.monotonic() + timeout
        while not self._ended():
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._over.wait(0.05 if left is None else min(0.05, left))
        self.join_stderr(1.0)
        return self._code

    def alive_here(self) -> bool:
        return not self._ended()

    def kill(self) -> None:
        """SIGKILL the agent and every process it started (it leads its session);
        nothing once it has ended (its pid may be another process's by then)."""
        if self._ended():
            return
        signal_all(descendants(self.pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
