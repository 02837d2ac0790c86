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
import io
import json
import os
import selectors
import shutil
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, NoReturn

from dmlctl.agent.procs import die_with_parent, end_forked, name_process, set_cmdline
from dmlctl.agent.zygote_client import MAX_MESSAGE, RANK, STANDIN, Client, ZygoteStarter
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
    fresh_signals()
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
                _become_rank(argv, env, request.cwd, fds)
            end_forked(lambda: _requester(request, fds, child, zygote))
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


def _requester(request: Request, fds: list[int], conn: socket.socket | None, zygote: int) -> int:
    """In a forked child: be torchrun (``python -m dmlctl.agent.torchrun argv[3:]``)
    or the stand-in, with ``fds[0]`` as standard output and error; the exit code. Its
    ranks are forked by the zygote behind ``conn``, or, without one (``warm`` false),
    started as new interpreters by torch."""
    die_with_parent(signal.SIGKILL, zygote)
    name_process(request.role.encode())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd in (1, 2):
        os.dup2(fds[0], fd)
    _own_stdio()
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    set_cmdline(list(request.argv))
    starter = ZygoteStarter(Client(conn)) if conn is not None else None
    try:
        if request.role == STANDIN:
            from dmlctl.agent import standin

            return standin.main(starter)
        from dmlctl.agent import torchrun

        sys.argv = ["torch.distributed.run", *request.argv[3:]]
        torchrun.main(request.argv[3:], starter)
        return 0
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            return int(e.code or 0)
        print(e.code, file=sys.stderr)
        return 1
    finally:
        import atexit

        atexit._run_exitfuncs()


def _become_rank(argv: list[str], env: Mapping[str, str], cwd: str, fds: list[int]) -> NoReturn:
    """In a forked child: become ``python -u -m dmlctl.runtime.entry argv[4:]``, started
    in ``cwd``."""
    try:
        os.setsid()
        os.chdir(cwd)
        name_process(f"rank {env.get('RANK', '')}".encode())
        fresh_signals()
        for target, fd in zip((1, 2), fds, strict=False):
            os.dup2(fd, target)
        _close_inherited()
        if (why := _cuda_unusable()) is not None:
            rank = env.get("RANK")
            os.write(2, f"dmlctl: {why}: rank {rank} starts as a new interpreter\n".encode())
            os.execve(argv[0], argv, env)  # the new interpreter after all, same process
        os.environ.clear()
        os.environ.update(env)
        set_cmdline(argv)
        _fresh_interpreter(env)
        from dmlctl.runtime import entry

        entry.run(argv[4:])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(1)


def _cuda_unusable() -> str | None:
    """What makes the GPUs unusable in a forked process (then only a new interpreter
    can use them): CUDA initialised in the zygote."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda._is_in_bad_fork():
        return "CUDA was initialised in the zygote"
    return None


def fresh_signals() -> None:
    """Handlers as a new interpreter has them: caught signals back to their default
    (as ``exec`` does), ignored ones still ignored, Python's own three set."""
    import faulthandler

    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            continue
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if faulthandler.is_enabled() and not os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.disable()


def _close_inherited() -> None:
    """Point every descriptor above 2 at ``/dev/null``: the zygote's sockets close in
    this process, and an object of the zygote's that closes its descriptor later
    closes only that ``/dev/null`` (never a file the script opened)."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != null:
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
    os.close(null)


def _fresh_interpreter(env: Mapping[str, str]) -> None:
    """``sys.path``, threads, stdio and random state as a new ``python -u`` started
    with ``env`` would have them."""
    import torch

    sys.path[:] = _sys_path(env.get("PYTHONPATH", ""))
    omp = env.get("OMP_NUM_THREADS")
    torch.set_num_threads(int(omp) if omp else len(os.sched_getaffinity(0)))
    _own_stdio(unbuffered=True)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _own_stdio(unbuffered: bool = False) -> None:
    """``sys.stdout`` and ``sys.stderr`` on descriptors 1 and 2, as a new interpreter
    makes them (``-u``: ``unbuffered``), and ``sys.stdin`` on 0."""
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        old: IO[str] = getattr(sys, f"__{name}__") or getattr(sys, name)
        _kept.append(old)
        stream = io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False),
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors=getattr(old, "errors", None) or errors,
            write_through=unbuffered,
            line_buffering=not unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin
    _kept.append(sys.stdin)
    sys.stdin = stdin
    setattr(sys, "__stdin__", stdin)  # noqa: B010 - typed Final in typeshed


_kept: list[Any] = []  # replaced stdio objects, kept so that their buffers never flush


def _sys_path(pythonpath: str) -> list[str]:
    """``sys.path`` as Python builds it from ``pythonpath``: this one's, with the
    zygote's ``PYTHONPATH`` entries replaced by those of ``pythonpath``."""

    def entries(value: str, cwd: str) -> list[str]:
        return [os.path.normpath(os.path.join(cwd, p)) for p in value.split(os.pathsep) if p]

    zygote = set(entries(STARTUP_ENV.get("PYTHONPATH", ""), STARTUP_CWD))
    wanted = entries(pythonpath, os.getcwd())
    rest = [p for p in sys.path[1:] if p not in zygote and p not in wanted]
    return [sys.path[0], *wanted, *rest]
