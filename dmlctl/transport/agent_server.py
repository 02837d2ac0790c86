"""Host agents on this machine from the agent server (:mod:`dmlctl.agent.server`).

:func:`start_agent` asks the server that matches this controller (same user,
interpreter, start-up environment and dmlctl) for a host agent, and returns it as a
:class:`WarmProcess` — or None, and then the caller starts ``python -m dmlctl.agent``
as before: no server yet (one is started for the launches that follow; it imports
torch while this launch runs), the server busy or gone, another interpreter, or
``DMLCTL_AGENT_SERVER_IDLE=0``.

The servers' sockets live in ``$XDG_RUNTIME_DIR/dmlctl`` or ``/tmp/dmlctl-UID``
(a directory only this user can enter, as tmux keeps its own); a server exits after
``DMLCTL_AGENT_SERVER_IDLE`` seconds (default 600) without a launch and without a
running agent.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import dmlctl
from dmlctl.agent.procs import descendants, signal_all
from dmlctl.agent_config import AgentRequest
from dmlctl.startup_env import read_at_start
from dmlctl.transport.pipes import Pipes, text_end

IDLE_ENV = "DMLCTL_AGENT_SERVER_IDLE"
IDLE_S = 600.0
ANSWER_WAIT_S = 10.0
"""How long a controller waits for the server to fork its agent (then: a new one)."""
AGENT = ("-m", "dmlctl.agent")
TITLE_ROOM = 512
"""Bytes of command line a server starts with: its agents show theirs in them."""


def idle_seconds(env: Mapping[str, str]) -> float:
    """The server's idle time from ``DMLCTL_AGENT_SERVER_IDLE`` (0 or less: no server;
    not a number: the default)."""
    try:
        return float(env.get(IDLE_ENV, IDLE_S))
    except ValueError:
        return IDLE_S


SOCKET_ROOM = 107 - len("/agent-0123456789abcdef.sock.1234567")
"""The longest directory a server's socket fits in (a Unix socket's path, 107 bytes,
with the name the server binds before it renames it)."""


def runtime_dir(env: Mapping[str, str]) -> Path | None:
    """This user's directory for server sockets, made if need be:
    ``$XDG_RUNTIME_DIR/dmlctl``, or ``dmlctl-UID`` in the temporary directory when
    there is none or its path is too long for a socket; None if neither fits or the
    directory is not this user's alone."""
    candidates = [Path(tempfile.gettempdir()) / f"dmlctl-{os.getuid()}"]
    if env.get("XDG_RUNTIME_DIR"):
        candidates.insert(0, Path(env["XDG_RUNTIME_DIR"]) / "dmlctl")
    path = next((p for p in candidates if len(str(p).encode()) <= SOCKET_ROOM), None)
    if path is None:
        return None
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def server_key(python: str, env: Mapping[str, str]) -> str:
    """What a server must share with a controller: the interpreter, what the
    interpreter and torch read as they start (:mod:`dmlctl.startup_env`), where
    modules are found (``PYTHONPATH``), what a process inherits besides its
    environment (:func:`inherited`), and this dmlctl's files (names, sizes,
    modification times)."""
    h = hashlib.sha256(os.path.realpath(python).encode())
    for key in sorted(k for k in env if read_at_start(k) or k in _ALSO_KEYED):
        h.update(f"\0{key}={env[key]}".encode())
    h.update(inherited().encode())
    root = Path(dmlctl.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        st = path.stat()
        h.update(f"\0{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


_ALSO_KEYED = ("PYTHONPATH", "TMPDIR", "TMP", "TEMP")
"""Besides :func:`~dmlctl.startup_env.read_at_start`: where modules are found, and
where torch's import puts its caches (the temporary directory)."""


def inherited() -> str:
    """This process's control group, CPU affinity, resource limits, nice value, ids,
    namespaces, and the torch it would import: an agent forked by a server has the
    server's (a Slurm job's cgroup, ``taskset``, ``ulimit -l`` for RDMA, a container),
    and its torch modules, so a server serves only controllers that have the same."""
    parts = []
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        parts.append(f.read())
    with contextlib.suppress(OSError, AttributeError):
        parts.append(repr(sorted(os.sched_getaffinity(0))))
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        with contextlib.suppress(OSError, ValueError):
            parts.append(f"{name}={resource.getrlimit(getattr(resource, name))}")
    with contextlib.suppress(OSError):
        parts.append(f"nice={os.getpriority(os.PRIO_PROCESS, 0)}")
    parts.append(f"ids={os.getuid()},{os.getgid()},{sorted(os.getgroups())}")
    for ns in ("mnt", "net", "pid", "user", "ipc", "uts"):
        with contextlib.suppress(OSError):
            parts.append(os.readlink(f"/proc/self/ns/{ns}"))
    torch = importlib.util.find_spec("torch")  # found, not imported
    for name in ("__init__.py", "version.py"):
        with contextlib.suppress(OSError, TypeError):
            st = os.stat(Path(torch.origin or "").parent / name)  # type: ignore[union-attr]
            parts.append(f"torch/{name}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def eligible(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether ``argv`` is ``<this python> -m dmlctl.agent …`` and ``env``'s
    ``PYTHONPATH`` holds only absolute directories (a relative one would be found from
    the server's directory, not this one)."""
    path = env.get("PYTHONPATH")
    return (
        len(argv) >= 3
        and tuple(argv[1:3]) == AGENT
        and os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
        and (path is None or all(os.path.isabs(p) for p in path.split(os.pathsep)))
    )


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
    idle = idle_seconds(env)
    where = runtime_dir(env) if idle > 0 and eligible(argv, env) else None
    if where is None:
        return None
    key = server_key(argv[0], env)
    sock_path, lock_path = where / f"agent-{key}.sock", where / f"agent-{key}.lock"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.settimeout(ANSWER_WAIT_S)  # a server that does not answer: as if none
    try:
        conn.connect(str(sock_path))
    except OSError:
        conn.close()
        _start_server(argv[0], sock_path, lock_path, idle, env)
        return None
    try:
        return _ask(host, conn, argv, cwd or os.getcwd(), env)
    except OSError:
        conn.close()
        raise


def _start_server(
    python: str, sock_path: Path, lock_path: Path, idle: float, env: Mapping[str, str]
) -> None:
    """Start a server for the next launches, unless one is starting (holds the lock)."""
    try:
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return
    argv = [python, "-m", "dmlctl.agent.server", str(sock_path), str(lock_path), f"{idle:g}"]
    argv.append(" " * TITLE_ROOM)  # room for its agents' command lines
    # It imports this controller's dmlctl, whatever its working directory would find.
    here = str(Path(dmlctl.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env={**env, "PYTHONPATH": path},
            start_new_session=True,
        )
    except OSError:
        return
    threading.Thread(target=proc.wait, daemon=True).start()  # it forks the server, exits


def _ask(
    host: str, conn: socket.socket, argv: Sequence[str], cwd: str, env: Mapping[str, str]
) -> WarmProcess | None:
    """Send the request with the agent's ends of three pipes; None if no pid comes."""
    ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
    theirs = [ends[0][0], ends[1][1], ends[2][1]]
    ours = [ends[0][1], ends[1][0], ends[2][0]]
    request = AgentRequest(tuple(argv), cwd, dict(env), _umask())
    try:
        socket.send_fds(conn, [request.to_json()], theirs)
    except OSError:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    try:
        pid = int(json.loads(conn.recv(4096))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        for fd in ours:  # an agent forked late reads the end of stdin and exits
            os.close(fd)
        conn.close()
        return None
    conn.settimeout(None)
    return WarmProcess(host, conn, pid, ours)


def _umask() -> int:
    """This process's umask, read without changing it (Linux), else 0o022."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


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
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            msg = self._conn.recv(4096)
            if msg:
                self._code = int(json.loads(msg)["exit"])
        self._conn.close()
        self._over.set()

    def _ended(self) -> bool:
        if self._code is not None:
            return True
        if not self._over.is_set():
            return False
        if _running(self.pid):  # the server is gone: the agent, not its code, is seen
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


def _running(pid: int) -> bool:
    """Whether ``pid`` lives and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
