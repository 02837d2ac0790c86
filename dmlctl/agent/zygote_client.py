"""The requester's side of the zygote (:mod:`dmlctl.agent.zygote`): its socket's
messages, and what the agent, torchrun and the stand-in get from it — a forked child's
pid, its exit code, or why the zygote refused (then a new interpreter is started)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

TORCHRUN = "torchrun"
STANDIN = "standin"
RANK = "rank"
MAX_MESSAGE = 1 << 20
"""The largest message on the zygote's socket (a request carries a whole environment)."""


@dataclass(frozen=True)
class Request:
    """What a requester asks the zygote to fork: a ``role`` (:data:`RANK`,
    :data:`TORCHRUN` or :data:`STANDIN`) to run ``argv`` with ``env`` in ``cwd``;
    ``warm``: torchrun's or the stand-in's ranks are forked here too (else torch starts
    them as new interpreters)."""

    role: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    warm: bool = True


class Client:
    """A requester's end of the zygote's socket: forks asked for, exit codes heard.
    Used from one thread."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._exits: dict[int, int] = {}
        self._gone = False
        self._ready = False

    def fork(
        self,
        role: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        fds: Sequence[int],
        warm: bool = True,
    ) -> int | str:
        """The pid of the child forked for this request, or why the zygote refused.
        ``warm`` (torchrun and the stand-in): their ranks are forked by the zygote too."""
        request = {"role": role, "argv": list(argv), "env": dict(env), "cwd": cwd, "warm": warm}
        try:
            socket.send_fds(self._conn, [json.dumps(request).encode()], list(fds))
            while True:
                reply = self._receive(block=True)
                if reply is None:
                    return "the zygote has ended"
                if "pid" in reply:
                    return int(reply["pid"])
                if "refused" in reply:
                    return str(reply["refused"])
        except OSError as exc:
            return f"the zygote cannot be reached: {exc}"

    def wait_ready(self, interval: float, keepalive: Callable[[], None]) -> None:
        """Return once the zygote has imported what it imports (or has ended), calling
        ``keepalive`` every ``interval`` seconds meanwhile: on a loaded host that takes
        longer than the controller waits for a word from the host."""
        import select

        while not self._ready and not self._gone:
            readable, _, _ = select.select([self._conn], [], [], interval)
            if readable:
                self._receive(block=True)
            else:
                keepalive()

    def exit_code(self, pid: int) -> int | None:
        """``pid``'s exit code once the zygote has reaped it (SIGKILL's when the
        zygote is gone: its children die with it)."""
        while not self._gone and pid not in self._exits and self._receive(block=False):
            pass
        if pid not in self._exits and self._gone:
            return -signal.SIGKILL
        return self._exits.get(pid)

    def _receive(self, block: bool) -> dict[str, Any] | None:
        """One message (exit codes are kept as they come); None when none is waiting
        (``block`` false) or the zygote has ended."""
        flags = 0 if block else socket.MSG_DONTWAIT
        try:
            data = self._conn.recv(MAX_MESSAGE, flags)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            self._gone = True
            return None
        message: dict[str, Any] = json.loads(data)
        if "ready" in message:
            self._ready = True
        if "exit" in message:
            self._exits[int(message["exit"])] = int(message["code"])
        return message


class ZygoteRank:
    """A rank the zygote forked (:class:`~dmlctl.agent.rank_procs.RankProcess`)."""

    def __init__(self, client: Client, pid: int) -> None:
        self._client = client
        self.pid = pid

    def poll(self) -> int | None:
        return self._client.exit_code(self.pid)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)


class ZygoteStarter:
    """Starts each rank from the zygote, or — where it refuses, said once on stderr —
    as a new interpreter."""

    def __init__(self, client: Client, say: Callable[[str], None] | None = None) -> None:
        self._client = client
        self._said = False
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> Any:
        from dmlctl.agent.rank_procs import NewInterpreter

        got = self._client.fork(RANK, argv, env, os.getcwd(), (1, 2))
        if isinstance(got, int):
            return ZygoteRank(self._client, got)
        if not self._said:
            self._said = True
            self._say(f"dmlctl: warm start refused ({got}): ranks start as new interpreters")
        return NewInterpreter(argv, env)


class ZygoteChild:
    """torchrun or the stand-in, forked by the zygote for the agent, with the part of
    :class:`subprocess.Popen` the agent uses: ``pid``, ``stdout`` (text, its output
    and errors together), ``poll``, ``wait`` and ``returncode``."""

    def __init__(self, client: Client, pid: int, stdout: IO[str]) -> None:
        self._client = client
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None

    @staticmethod
    def fork(
        client: Client,
        role: str,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str],
        warm: bool,
    ) -> ZygoteChild | str:
        """The child for ``role``, or why the zygote refused it; ``warm``: its ranks are
        forked by the zygote too (else torch starts them as new interpreters)."""
        read, write = os.pipe()
        try:
            got = client.fork(role, argv, env, cwd, (write,), warm)
        finally:
            os.close(write)
        if isinstance(got, str):
            os.close(read)
            return got
        return ZygoteChild(client, got, os.fdopen(read, "r", errors="replace"))

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._client.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        import time

        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                return None
            time.sleep(0.02)
        return self.returncode
