"""What a child of the zygote (:mod:`dmlctl.agent.zygote`) becomes once forked:
torchrun or the stand-in (:func:`requester`), or a rank (:func:`become_rank`) made into
what a new interpreter started for it would be — its signals, descriptors, stdio,
``sys.path``, threads and random state as ``python -u`` would have them."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import IO, Any, NoReturn

from dmlctl.agent.procs import die_with_parent, name_process, set_cmdline
from dmlctl.agent.zygote_client import STANDIN, Client, Request, ZygoteStarter


def requester(request: Request, fds: list[int], conn: socket.socket | None, zygote: int) -> int:
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
    own_stdio()
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


def become_rank(
    argv: list[str],
    env: Mapping[str, str],
    cwd: str,
    fds: list[int],
    started: tuple[Mapping[str, str], str],
) -> NoReturn:
    """In a forked child: become ``python -u -m dmlctl.runtime.entry argv[4:]``, started
    in ``cwd``; ``started``: the environment and directory the zygote started with."""
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
        _fresh_interpreter(env, started)
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


def _fresh_interpreter(env: Mapping[str, str], started: tuple[Mapping[str, str], str]) -> None:
    """``sys.path``, threads, stdio and random state as a new ``python -u`` started
    with ``env`` would have them."""
    import torch

    sys.path[:] = _sys_path(env.get("PYTHONPATH", ""), *started)
    omp = env.get("OMP_NUM_THREADS")
    torch.set_num_threads(int(omp) if omp else len(os.sched_getaffinity(0)))
    own_stdio(unbuffered=True)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def own_stdio(unbuffered: bool = False) -> None:
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


def _sys_path(pythonpath: str, started_env: Mapping[str, str], started_cwd: str) -> list[str]:
    """``sys.path`` as Python builds it from ``pythonpath``: this one's, with the
    zygote's ``PYTHONPATH`` entries (``started_env``'s, relative to ``started_cwd``)
    replaced by those of ``pythonpath``."""

    def entries(value: str, cwd: str) -> list[str]:
        return [os.path.normpath(os.path.join(cwd, p)) for p in value.split(os.pathsep) if p]

    zygote = set(entries(started_env.get("PYTHONPATH", ""), started_cwd))
    wanted = entries(pythonpath, os.getcwd())
    rest = [p for p in sys.path[1:] if p not in zygote and p not in wanted]
    return [sys.path[0], *wanted, *rest]
