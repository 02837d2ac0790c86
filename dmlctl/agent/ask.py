"""Asking this host's agent server (:mod:`dmlctl.agent.server`) for a host agent.

Two starters use it: a controller on this machine
(:mod:`dmlctl.transport.agent_server`, which passes the agent ends of pipes of its
own) and a remote host's entry point ``python -m dmlctl.agent.served`` (which passes
its own stdin, stdout and stderr: the SSH channel's). Where none listens yet,
the first starter starts one and every starter waits for it: its import of torch
serves the first agent too, where a new agent would make the same import beside it.
Both get None where no server answers — the one started failed, the server busy or
gone, another interpreter, or ``DMLCTL_AGENT_SERVER_IDLE=0`` — and then start
``python -m dmlctl.agent`` as before.

The servers' sockets live in ``$XDG_RUNTIME_DIR/dmlctl`` or ``/tmp/dmlctl-UID``
(a directory only this user can enter, as tmux keeps its own); a server exits after
``DMLCTL_AGENT_SERVER_IDLE`` seconds (default 600) without a request and without a
running agent. Torch-free: nothing here imports more than the standard library.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import resource
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import dmlctl
from dmlctl.agent_config import AgentRequest
from dmlctl.startup_env import read_at_start

IDLE_ENV = "DMLCTL_AGENT_SERVER_IDLE"
IDLE_S = 600.0
ANSWER_WAIT_S = 10.0
"""How long a starter waits for the server to fork its agent (then: a new one)."""
START_WAIT_S = 120.0
"""The longest a starter waits for a server that is starting (importing torch) before
it starts its agent itself: a host so loaded that the import takes longer."""
WAIT_POLL_S = 0.05
"""How often a starter waiting for a starting server looks whether it listens."""
LOCK_GRACE_S = 10.0
"""How long a server just started has to take its lock (an interpreter's start, on a
loaded host) before the starter counts it as failed."""
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
    """What a server must share with a starter: the interpreter, what the
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
    server's (a Slurm job's cgroup, ``taskset``, ``ulimit -l`` for RDMA, a container,
    a network namespace), and its torch modules, so a server serves only starters that
    have the same."""
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


def connect(
    argv: Sequence[str], env: Mapping[str, str], waiting: Callable[[], None] | None = None
) -> socket.socket | None:
    """A connection to the server that can fork ``argv`` (a host agent) with ``env``,
    or None (module docstring). Where none listens, one is started, unless one is
    starting already, and this waits for it (calling ``waiting()`` between its looks,
    every :data:`WAIT_POLL_S` seconds): the server's import of torch serves this
    start and those that follow, and a new agent would make the same import beside
    it. None once the server being started has ended without listening, or after
    :data:`START_WAIT_S`."""
    idle = idle_seconds(env)
    where = runtime_dir(env) if idle > 0 and eligible(argv, env) else None
    if where is None:
        return None
    key = server_key(argv[0], env)
    sock_path, lock_path = where / f"agent-{key}.sock", where / f"agent-{key}.lock"
    deadline = time.monotonic() + START_WAIT_S
    started: float | None = None  # when this starter started a server
    while True:
        conn = _dial(sock_path)
        if conn is not None:
            return conn
        held = _held(lock_path)
        if held is None:
            return None
        if not held and started is None:  # no server lives or is starting: start one
            if not _start_server(argv[0], sock_path, lock_path, idle, env):
                return None
            started = time.monotonic()
        elif not held and started is not None and time.monotonic() - started > LOCK_GRACE_S:
            return None  # the one started did not come up (it says nothing here)
        if time.monotonic() >= deadline:
            return None
        if waiting is not None:
            waiting()
        time.sleep(WAIT_POLL_S)


def _dial(sock_path: Path) -> socket.socket | None:
    """A connection to the server listening on ``sock_path``, or None."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.settimeout(ANSWER_WAIT_S)  # a server that does not answer: as if none
    try:
        conn.connect(str(sock_path))
    except OSError:
        conn.close()
        return None
    return conn


def _held(lock_path: Path) -> bool | None:
    """Whether a server holds ``lock_path`` (it runs, or is starting); None when the
    lock cannot be looked at."""
    try:
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    return False


def _start_server(
    python: str, sock_path: Path, lock_path: Path, idle: float, env: Mapping[str, str]
) -> bool:
    """Start a server on ``sock_path`` (it detaches, takes ``lock_path``, imports,
    then listens); False when it cannot be started."""
    argv = [python, "-m", "dmlctl.agent.server", str(sock_path), str(lock_path), f"{idle:g}"]
    argv.append(" " * TITLE_ROOM)  # room for its agents' command lines
    # It imports this starter's dmlctl, whatever its working directory would find.
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
        return False
    threading.Thread(target=proc.wait, daemon=True).start()  # it forks the server, exits
    return True


def request(
    conn: socket.socket,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    stdio: Sequence[int],
    starter: int | None = None,
) -> int | None:
    """Ask for ``argv`` in ``cwd`` with ``env`` and this process's umask, on the three
    descriptors ``stdio`` (its stdin, stdout, stderr), stopping when ``starter`` ends
    (if given); the agent's pid, or None (and ``conn`` closed) when no pid came.
    Raises OSError when the request cannot be sent."""
    message = AgentRequest(tuple(argv), cwd, dict(env), _umask(), starter).to_json()
    socket.send_fds(conn, [message], list(stdio))
    try:
        pid = int(json.loads(conn.recv(4096))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        conn.close()
        return None
    conn.settimeout(None)
    return pid


def exit_code(conn: socket.socket) -> int | None:
    """Wait for the agent's exit code (``-N``: killed by signal N); None when the
    server went away first. Closes ``conn``."""
    code = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        msg = conn.recv(4096)
        if msg:
            code = int(json.loads(msg)["exit"])
    conn.close()
    return code


def running(pid: int) -> bool:
    """Whether ``pid`` lives and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _umask() -> int:
    """This process's umask, read without changing it (Linux), else 0o022."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022
