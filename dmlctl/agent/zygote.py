"""The zygote: one process per host agent that has imported torch and dmlctl's
runtime, never has a second thread, and forks what asks for it.

The host agent forks it as the agent starts (:func:`start`), before the agent has a
thread of its own. The zygote imports torch, ``torch._dynamo`` (which every
optimizer imports), torchrun and the runtime, then serves requests on a socket:

* from the agent: fork torchrun (:mod:`dmlctl.agent.torchrun`), or the stand-in of
  an in-place run (:mod:`dmlctl.agent.standin`), with the agent's pipe as its output.
  torchrun then skips its own import of torch (a second of a core on every launch and
  restart). Its ranks are new interpreters that torch starts (fresh ranks, the
  default) unless the job asks for ``ranks.start: warm``;
* with ``ranks.start: warm``, from that torchrun or stand-in (on a socket of its own):
  fork a rank, with the requester's standard output and error. A rank forked here
  becomes what ``python -u -m dmlctl.runtime.entry SCRIPT ARGS`` started with the same
  environment would be, except for what the interpreter and torch read as they start
  (see :attr:`dmlctl.spec.ranks.RanksSpec.start`).

Before every fork the zygote checks that it has one thread (``/proc/self/task``); if
not, or if the environment asks for what a fork cannot give (:func:`can_fork`,
:func:`can_fork_torchrun`), it refuses, and the requester starts a new interpreter
instead, saying so in one line. It reaps its children and tells their requester each
one's exit code (the requester's side: :mod:`dmlctl.agent.zygote_client`). When a
requester's socket closes, the zygote kills the children it forked for it; when the
agent's closes, it ends. The zygote dies with the agent (``PR_SET_PDEATHSIG``), and
each child with the zygote.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dmlctl.agent import zygote_child
from dmlctl.agent.procs import die_with_parent, end_forked, name_process
from dmlctl.agent.zygote_client import MAX_MESSAGE, RANK, Request
from dmlctl.startup_env import read_at_start

ENTRY = ("-u", "-m", "dmlctl.runtime.entry")
POLL_S = 0.05
_QUIET_IMPORT = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
"""Set while the zygote imports torch (unless the environment sets them): numpy's
OpenBLAS starts a pool thread as it is imported otherwise."""

STARTUP_ENV: dict[str, str] = dict(os.environ)  # this process's own, as it started
STARTUP_CWD = os.getcwd()
SET_BY_IMPORT: set[str] = set()
"""Variables torch's import set here (its caches): a rank without them would set the
same as it imports torch itself."""


def threads() -> int:
    """How many threads this process has now (1 where ``/proc`` cannot say)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def can_fork(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why a rank started as ``argv`` with ``env`` cannot be forked from the zygote
    (None: it can): ``argv`` must be ``<this python> -u -m dmlctl.runtime.entry
    SCRIPT …`` and ``env`` agree with the zygote's on what is read at start."""
    if len(argv) < 5 or tuple(argv[1:4]) != ENTRY:
        return "the rank's command is not dmlctl's entry"
    omp = env.get("OMP_NUM_THREADS")
    if omp is not None and not (omp.isdigit() and int(omp) > 0):
        return f"OMP_NUM_THREADS={omp} is not a number of threads"
    if "" in env.get("PYTHONPATH", "x").split(os.pathsep):
        return "PYTHONPATH has an empty entry (the directory Python starts in)"
    return other_interpreter(argv[0], env) or env_differs(env)


def can_fork_torchrun(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why torchrun (or the stand-in) started as ``argv`` with ``env`` cannot be forked
    from the zygote (None: it can): ``argv`` must be ``<this python> -m MODULE …`` and
    ``env`` agree with the zygote's on what is read at start."""
    if len(argv) < 3 or argv[1] != "-m":
        return "torchrun's command is not a module of this interpreter"
    return other_interpreter(argv[0], env) or env_differs(env)


def other_interpreter(python: str, env: Mapping[str, str]) -> str | None:
    """Why ``python`` (a path, or a name looked up on ``env``'s ``PATH``) is not this
    interpreter (None: it is). A virtual environment's ``python`` links to its base
    interpreter, so the environment it belongs to is compared, not the file."""
    found = shutil.which(python, path=env.get("PATH")) if os.sep not in python else python
    if found is None or _environment_of(found) != _environment_of(sys.executable):
        return f"the interpreter is {python}, not {sys.executable}"
    return None


def _environment_of(python: str) -> str:
    """The virtual environment ``python`` starts in (its directory holding
    ``pyvenv.cfg``), or the interpreter's own file outside one."""
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if os.path.exists(os.path.join(prefix, "pyvenv.cfg")):
        return prefix
    return os.path.realpath(python)


def env_differs(env: Mapping[str, str]) -> str | None:
    """Which variables read at start ``env`` gives other values than the zygote
    started with (None: none; what torch's import set here counts as agreeing)."""
    keys = sorted(k for k in {*env, *STARTUP_ENV} if read_at_start(k))
    differ = [
        k
        for k in keys
        if env.get(k) != STARTUP_ENV.get(k) and not (k not in env and k in SET_BY_IMPORT)
    ]
    if differ:
        return f"{', '.join(differ)} differ from what torch was imported with"
    return None


def start(warm: bool = True) -> socket.socket | None:
    """Fork the zygote from this process (which must have one thread) and return the
    socket to it; None where it cannot be forked (for ``warm``, the zygote of
    ``ranks.start: warm``, after one line on stderr: the ranks then start fresh)."""
    count = threads()
    if count != 1:
        if warm:
            print(f"dmlctl agent: {count} threads: ranks start fresh", file=sys.stderr)
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
        stream.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the zygote, which never returns
        ours.close()
        end_forked(lambda: _zygote(theirs, parent, warm))
    theirs.close()
    return ours


def _zygote(agent: socket.socket, parent: int, warm: bool) -> int:
    """Be the zygote (see the module) until the agent's socket closes; ``warm``: it
    forks ranks too."""
    die_with_parent(signal.SIGKILL, parent)
    name_process(b"dmlctl-zygote")
    zygote_child.fresh_signals()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # the agent's stdout carries its messages: never write there
    os.close(null)
    Zygote(agent, import_the_runtime(warm)).serve()
    return 0


def import_the_runtime(ranks: bool = True) -> str | None:
    """Import, once and in this thread, what torchrun imports, and with ``ranks`` what
    every rank imports too; why it could not be (None: it was). What the imports set
    in the environment (torch's caches) is kept: a rank's own import would set the
    same."""
    quiet = {k: v for k, v in _QUIET_IMPORT.items() if k not in os.environ}
    os.environ.update(quiet)
    before = dict(os.environ)
    why = None
    try:
        import torch.distributed.run

        import dmlctl.agent.elastic_agent
        import dmlctl.agent.rendezvous
        import dmlctl.agent.torchrun

        if ranks:
            with contextlib.suppress(Exception):  # the ranks meet the error themselves
                import torch._dynamo  # noqa: F401
            import dmlctl.runtime.entry
            import dmlctl.runtime.session  # noqa: F401
    except Exception as exc:
        why = f"torch cannot be imported: {exc}"
    changes = {k: v for k, v in os.environ.items() if before.get(k) != v}
    SET_BY_IMPORT.update(changes)
    for key in quiet:
        os.environ.pop(key, None)
    os.environ.update(changes)
    STARTUP_ENV.clear()
    STARTUP_ENV.update(os.environ)
    return why


class Zygote:
    """The zygote's loop: requests in, children forked, exit codes out."""

    def __init__(self, agent: socket.socket, broken: str | None = None) -> None:
        self._agent = agent
        self._broken = broken
        self._selector = selectors.DefaultSelector()
        self._owner: dict[int, socket.socket] = {}  # child pid → who asked for it
        self._add(agent)

    def _add(self, conn: socket.socket) -> None:
        self._selector.register(conn, selectors.EVENT_READ)

    def serve(self) -> None:
        _send(self._agent, {"ready": self._broken or True})
        while True:
            for key, _ in self._selector.select(POLL_S):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                if not self._request(conn):
                    if conn is self._agent:
                        self._kill_all()
                        return
                    self._drop(conn)
            self._reap()

    def _request(self, conn: socket.socket) -> bool:
        """Serve one request of ``conn``; False when it has closed."""
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 4)
        except OSError:
            return False
        if not data:
            return False
        try:
            request = json.loads(data)
            role, argv = str(request["role"]), [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in request["env"].items()}
            cwd = str(request.get("cwd") or os.getcwd())
            warm = bool(request.get("warm", True))
        except (KeyError, ValueError, AttributeError) as exc:
            _send(conn, {"refused": f"a request the zygote cannot read: {exc}"})
            return True
        try:
            _send(conn, self._fork(conn, Request(role, argv, env, cwd, warm), fds))
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _fork(self, conn: socket.socket, request: Request, fds: list[int]) -> dict[str, Any]:
        """Fork one child for ``conn``; the reply."""
        if self._broken:
            return {"refused": self._broken}
        role, argv, env = request.role, request.argv, request.env
        why = can_fork(argv, env) if role == RANK else can_fork_torchrun(argv, env)
        if why:
            return {"refused": why}
        if role == RANK:
            _load_strategy(env)
        count = threads()
        if count != 1:
            return {"refused": f"the zygote has {count} threads"}
        child: socket.socket | None = None
        if role != RANK and request.warm:  # its ranks are forked here too
            mine, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, which never returns
            for key in list(self._selector.get_map().values()):
                with contextlib.suppress(OSError):
                    os.close(key.fd)
            self._selector.close()
            if role == RANK:
                zygote_child.become_rank(argv, env, request.cwd, fds, (STARTUP_ENV, STARTUP_CWD))
            end_forked(lambda: zygote_child.requester(request, fds, child, zygote))
        if child is not None:
            child.close()
            self._add(mine)
        self._owner[pid] = conn
        return {"pid": pid}

    def _reap(self) -> None:
        while self._owner:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self._owner.pop(pid, None)
            if conn is not None:
                _send(conn, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def _drop(self, conn: socket.socket) -> None:
        """``conn`` closed: kill what it asked for (as torchrun's ranks die with it)."""
        self._selector.unregister(conn)
        conn.close()
        for pid, owner in list(self._owner.items()):
            if owner is conn:
                _kill_group(pid)

    def _kill_all(self) -> None:
        for pid in list(self._owner):
            _kill_group(pid)


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


def _load_strategy(env: Mapping[str, str]) -> None:
    """Import the rank's strategy here, once, before the fork (a rank names a bad
    strategy itself)."""
    from dmlctl import protocol
    from dmlctl.strategies import registry

    with contextlib.suppress(Exception):
        registry.load(env.get(protocol.ENV_STRATEGY) or protocol.DEFAULT_STRATEGY)


def _send(conn: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    with contextlib.suppress(OSError):  # a requester that is gone has nothing to learn
        socket.send_fds(conn, [json.dumps(message).encode()], list(fds))
