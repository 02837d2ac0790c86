"""The agent server: host agents for runs on this machine, forked from a process that
has imported dmlctl's agent and torch already (after it forked its first agent: the
zygotes of the agents that follow then import nothing, :mod:`dmlctl.agent.zygote`).

A host agent spends its first tenths of a second importing its own code, and its
zygote a second or more importing torch — on every launch, every restart, every
standby. On this machine the controller asks a server instead
(:mod:`dmlctl.transport.agent_server`): one process per user, interpreter,
start-up environment and dmlctl, started (and waited for) by a first launch, that
has made those imports once and forks each agent a launch asks for. The agent it
forks is what ``python -m dmlctl.agent`` started by the controller would be: the
controller's stdin, stdout and stderr (passed over the server's socket), its
environment, working directory, umask and command line (``ps`` shows ``… -m
dmlctl.agent --run-id RUN``), a session of its own; its exit code goes back to the
controller over the same connection. The server runs nothing else, has no thread,
and exits once it has forked no agent for its idle time and none of its agents runs.

``python -m dmlctl.agent.server SOCKET LOCK IDLE_S ROOM`` (what the controller starts;
``ROOM``: blanks, the command-line space its agents write theirs into):
it detaches, holds ``LOCK`` for its lifetime (one server per socket), imports, and
only then binds ``SOCKET`` — a controller that can connect is answered at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from dmlctl.agent import zygote, zygote_child
from dmlctl.agent.procs import end_forked, exit_status, name_process, set_cmdline
from dmlctl.agent_config import WARM_FLAG, AgentRequest

MAX_REQUEST = 1 << 20
REQUEST_WAIT_S = 5.0
"""How long the server waits for the request of a controller that has connected."""


def main(argv: Sequence[str]) -> int:
    """Serve agents on ``argv = [SOCKET, LOCK, IDLE_S, …]`` until idle (see module)."""
    sock_path, lock_path, idle = argv[0], argv[1], float(argv[2])
    if os.fork():  # the controller that started it reaps this at once
        os._exit(0)
    os.setsid()
    lock = open(lock_path, "a")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another server has this socket
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)  # not ignored because its first controller was
    name_process(b"dmlctl-server")
    set_cmdline(["dmlctl agent server", sock_path])
    from dmlctl.agent import __main__ as agent_main  # noqa: F401 - the agents' code

    adopted: dict[str, str] = {}
    listener = _listen(sock_path)
    bound = os.stat(sock_path).st_ino
    try:
        _serve(listener, adopted, idle, lock.fileno())
    finally:
        with contextlib.suppress(OSError):
            if os.stat(sock_path).st_ino == bound:  # not a later server's
                os.unlink(sock_path)
        listener.close()  # nobody waits on it while the interpreter ends
    os._exit(0)


def _listen(path: str) -> socket.socket:
    """A listening socket at ``path``, replacing a dead server's (this one holds the
    lock): bound under a name of its own first, so nobody connects half-made."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    tmp = f"{path}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    listener.bind(tmp)
    os.chmod(tmp, 0o600)
    listener.listen(16)
    os.replace(tmp, path)
    return listener


def _serve(listener: socket.socket, adopted: dict[str, str], idle: float, lock: int) -> None:
    """Accept, fork, report exits; return once idle for ``idle`` seconds with no agent
    (an agent must not hold the ``lock`` descriptor: it would keep the next server out)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: stopped.append(signum))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    agents: dict[int, socket.socket] = {}  # pid → its controller's connection
    last = time.monotonic()  # of the last request or agent's end
    while not stopped and (agents or time.monotonic() - last < idle):
        wait = None if agents else max(0.0, last + idle - time.monotonic())
        for key, _ in sel.select(wait):
            if key.fileobj is listener:
                _accept(listener, agents, adopted, (wake_r, wake_w, lock))
                last = time.monotonic()
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
        if _reap(agents):
            last = time.monotonic()


def _reap(agents: dict[int, socket.socket]) -> bool:
    """Tell the controller of each agent that ended its exit code; whether one had."""
    ended = False
    for pid in list(agents):
        try:
            code = exit_status(pid)
        except ChildProcessError:
            code = 255
        if code is not None:
            ended = True
            conn = agents.pop(pid)
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"exit": code}).encode())
            conn.close()
    return ended


def _accept(
    listener: socket.socket,
    agents: dict[int, socket.socket],
    adopted: dict[str, str],
    own: tuple[int, ...],
) -> None:
    """Read one controller's request and fork its agent; answer with the agent's pid."""
    try:
        conn, _ = listener.accept()
    except OSError:  # out of descriptors, say: the controller goes on without
        return
    fds: list[int] = []
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():
            raise OSError("another user")
        conn.settimeout(REQUEST_WAIT_S)
        msg, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
        request = AgentRequest.from_json(msg)
        if len(fds) != 3:
            raise OSError("not three descriptors")
    except (OSError, ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    close = [listener.fileno(), *own, *(c.fileno() for c in agents.values()), conn.fileno()]
    try:
        pid = os.fork()
    except OSError:  # out of memory or processes: this controller starts its own
        pid = -1
    if pid == 0:  # pragma: no cover - runs in the child, which never returns
        end_forked(lambda: _agent(request, fds, adopted, close))
    for fd in fds:
        os.close(fd)
    if pid < 0:
        conn.close()
        return
    agents[pid] = conn
    with contextlib.suppress(OSError):
        conn.send(json.dumps({"pid": pid}).encode())
    # Imported after the fork, for the agents that follow: this agent's zygote imports
    # what it lacks while the agent tells its controller it lives (an import here
    # first, seconds on a loaded host, would keep the controller waiting in silence).
    _runtime_imported(adopted, WARM_FLAG in request.argv)


def _runtime_imported(adopted: dict[str, str], ranks: bool) -> bool:
    """Import torchrun here, once, for every agent, and with ``ranks`` (an agent of
    ``ranks.start: warm``) what a rank imports too: their zygotes then import nothing.
    What the imports set in the environment is added to ``adopted``. False when they
    cannot be imported."""
    if "torch._dynamo" in sys.modules or ("torch" in sys.modules and not ranks):
        return True
    before = dict(os.environ)
    if zygote.import_the_runtime(ranks) is not None:
        return False
    adopted.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    return True


def _agent(
    request: AgentRequest,
    fds: Sequence[int],
    adopted: Mapping[str, str],
    close: Sequence[int],
) -> int:
    """In the forked child: become ``python -m dmlctl.agent`` as the controller would
    have started it; the agent's exit code."""
    os.setsid()
    zygote_child.fresh_signals()
    for fd in close:
        with contextlib.suppress(OSError):
            os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    argv, cwd = list(request.argv), request.cwd
    os.chdir(cwd)
    os.umask(request.umask)
    os.environ.clear()
    # What torch's import set, unless set here: only for an agent whose zygote forks
    # ranks from this import (a fresh rank's own import sets what it sets).
    warm = WARM_FLAG in request.argv
    os.environ.update({**(adopted if warm else {}), **request.env})
    tempfile.tempdir = None  # found again from this environment
    zygote.STARTUP_ENV.clear()
    zygote.STARTUP_ENV.update(os.environ)
    zygote.STARTUP_CWD = cwd
    sys.path[0] = cwd  # as ``python -m`` puts it
    sys.argv = [sys.modules["dmlctl.agent.__main__"].__file__ or "", *argv[3:]]
    set_cmdline(argv)
    _own_stdio()
    from dmlctl.agent import __main__ as agent_main

    return agent_main.main(watch_parent=False, starter=request.starter)


_kept: list[object] = []  # the server's stdio objects, kept so their buffers never flush


def _own_stdio() -> None:
    """``sys.stdin``, ``stdout`` and ``stderr`` on descriptors 0, 1, 2 as a new
    interpreter makes them for pipes (same encoding and error handlers)."""
    _kept.extend((sys.stdin, sys.stdout, sys.stderr))

    def wrap(fd: int, mode: str, like: io.TextIOWrapper) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffered, encoding=like.encoding, errors=like.errors)

    sys.stdin = wrap(0, "r", sys.__stdin__)  # type: ignore[arg-type]
    sys.stdout = wrap(1, "w", sys.__stdout__)  # type: ignore[arg-type]
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding=sys.__stderr__.encoding if sys.__stderr__ else "utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
