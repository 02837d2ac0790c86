"""Rank processes forked from the warm torchrun instead of started as new interpreters.

torchrun starts every rank as a new process, ``python -u -m dmlctl.runtime.entry
SCRIPT ARGS…``, and each one imports torch again (1–2 s of a core, per rank, per
attempt). The warm torchrun (:mod:`dmlctl.agent.warm`) has torch and the runtime
imported already, so :func:`install` has it fork each rank instead; the child
becomes what the new interpreter would have been:

* its own session (torchrun signals the rank's process group), signal handlers as a
  new interpreter has them, and no descriptor of torchrun's but 0, 1 and 2 (the
  others now point at ``/dev/null``, so no rank holds the rendezvous port);
* the rank's environment, ``sys.path`` built from its ``PYTHONPATH`` as Python
  builds it, ``OMP_NUM_THREADS`` applied (``torch.set_num_threads``), unbuffered
  stdout and stderr as ``-u`` makes them, only the exit handlers a new interpreter
  would have, and numpy's global generator seeded afresh;
* then :func:`dmlctl.runtime.entry.run`, which ends the process itself.

A rank is forked only when nothing that Python or torch reads as it starts differs
between the agent's environment and the rank's (:func:`can_fork`); otherwise — a
``TORCH_LOGS`` of the job, another ``LD_PRELOAD``, a numactl prefix — torchrun
starts it as before. torchrun's questions about GPUs are answered in a short-lived
child, so neither CUDA nor NVML is initialised where the ranks are forked and a
forked rank uses its GPU as a new process would; should one be all the same, the
forked child executes the new interpreter instead (and says so).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import functools
import gc
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NoReturn

from dmlctl import protocol
from dmlctl.agent import respawn
from dmlctl.agent.procs import exit_status, name_process
from dmlctl.startup_env import read_at_start

ENTRY = ("-u", "-m", "dmlctl.runtime.entry")

STARTUP_ENV: dict[str, str] = dict(os.environ)  # the agent's own, as it started
STARTUP_CWD = os.getcwd()


def adopt_environment(changes: Mapping[str, str]) -> None:
    """Count ``changes`` that this process's own imports made to its environment as
    part of its start-up environment (torch sets some as it imports its modules)."""
    STARTUP_ENV.update(changes)


def can_fork(args: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether ``args`` is ``<this python> -u -m dmlctl.runtime.entry SCRIPT …`` and
    ``env`` agrees with the agent's on everything read at start-up."""
    if len(args) < 5 or tuple(args[1:4]) != ENTRY:
        return False
    if os.path.realpath(args[0]) != os.path.realpath(sys.executable):
        return False
    threads = env.get("OMP_NUM_THREADS")
    if threads is not None and not (threads.isdigit() and int(threads) > 0):
        return False
    if "" in env.get("PYTHONPATH", "x").split(os.pathsep):
        return False  # an empty entry means the directory Python starts in
    keys = {k for k in (*env, *STARTUP_ENV) if read_at_start(k)}
    return all(env.get(k) == STARTUP_ENV.get(k) for k in keys)


class ForkedRank:
    """One forked rank, with the part of :class:`subprocess.Popen` torchrun uses:
    ``pid``, ``args``, ``returncode``, ``poll``, ``wait`` (raising
    :class:`subprocess.TimeoutExpired`), ``send_signal``, ``terminate`` and ``kill``.

    With ``restart.mode: in_place`` a worker killed by SIGKILL is forked again
    (:mod:`dmlctl.agent.respawn`): :meth:`poll` then reports it running, with the new
    ``pid``; never once torchrun has signalled it (torchrun stops its workers)."""

    def __init__(
        self, args: Sequence[str], env: Mapping[str, str], out: IO[Any] | None, err: IO[Any] | None
    ) -> None:
        self.args = list(args)
        self._env, self._out, self._err = dict(env), out, err
        self.respawns = 0
        self._signalled = False
        self.pid = self._fork(self._env)
        self.returncode: int | None = None

    def _fork(self, env: Mapping[str, str]) -> int:
        for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
            stream.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which never returns
            _become_rank(self.args, env, self._out, self._err)
        return pid

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                code = exit_status(self.pid)
            except ChildProcessError:  # reaped by someone else: its status is lost
                code = 255
            if code is not None and not self._signalled and respawn.over_before(self._env, code):
                code = 0
            if code is not None and not self._respawned(code):
                self.returncode = code
        return self.returncode

    def _respawned(self, code: int) -> bool:
        """Fork the rank again if :func:`~dmlctl.agent.respawn.may_respawn` lets it."""
        if self._signalled or not respawn.may_respawn(self._env, code, self.respawns):
            return False
        self.respawns += 1
        self.pid = self._fork(respawn.rejoin_env(self._env, self.respawns))
        respawn.record(self._env, code, self.pid)
        return True

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        return code

    def stopping(self) -> None:
        """torchrun stops its workers: this rank is never forked again."""
        self._signalled = True

    def send_signal(self, sig: int) -> None:
        self.stopping()
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def install() -> None:
    """Make this torchrun fork the ranks :func:`can_fork` allows (call it in the warm
    torchrun before its ``main``)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import (
        subprocess_handler as handler,
    )

    _import_the_runtime()

    cold = handler.SubprocessHandler._popen
    _ask_cuda_in_a_child()

    def _popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        if can_fork(args, env):
            return ForkedRank(args, env, self._stdout, self._stderr)
        if protocol.in_place(env):
            rank = env.get("RANK", "?")
            print(  # only a forked rank is forked again: this one restarts the run
                f"dmlctl: rank {rank} starts as a new interpreter, so restart.mode: "
                "in_place cannot replace it alone; its loss restarts the run",
                file=sys.stderr,
                flush=True,
            )
        return cold(self, args, env)

    handler.SubprocessHandler._popen = _popen  # type: ignore[method-assign]
    respawn.follow_in_torchrun()
    gc.freeze()  # the ranks share these pages; no collection of theirs touches them


def warm_runtime() -> None:
    """Ready this process to fork ranks with :class:`ForkedRank` outside torchrun (the
    stand-in of :mod:`dmlctl.agent.standin`): the runtime imported, its pages frozen."""
    _import_the_runtime()
    gc.freeze()


def _import_the_runtime() -> None:
    """Import, once and here, what every rank imports: the runtime entry,
    ``dmlctl.init()`` and the job's strategy."""
    import dmlctl.runtime.entry
    import dmlctl.runtime.session  # noqa: F401
    from dmlctl.strategies import registry

    with contextlib.suppress(Exception):  # a rank names a bad strategy itself
        registry.load(os.environ.get(protocol.ENV_STRATEGY) or protocol.DEFAULT_STRATEGY)


_CUDA_QUERIES = ("is_available", "device_count")
_cuda_own: dict[str, Callable[[], Any]] = {}


def _ask_cuda_in_a_child() -> None:
    """Have this process answer torchrun's questions about GPUs (``is_available``,
    ``device_count``) from a short-lived forked child: answering them here would load
    the CUDA driver or NVML, whose state a forked rank cannot use."""
    import torch.cuda

    for name in _CUDA_QUERIES:
        own = getattr(torch.cuda, name)
        _cuda_own[name] = own
        setattr(torch.cuda, name, functools.partial(_answer_in_a_child, own))


def _answer_in_a_child(query: Callable[[], Any]) -> Any:
    """``query()``, run in a forked child (its own answer here if the child gives none)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.write(write, json.dumps(query()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read()
    os.waitpid(pid, 0)
    return json.loads(answer) if answer else query()


def _restore_cuda_queries() -> None:
    """torch's own ``is_available`` and ``device_count`` (for the script)."""
    cuda = sys.modules.get("torch.cuda")
    for name, own in _cuda_own.items() if cuda is not None else ():
        setattr(cuda, name, own)


def _become_rank(
    args: list[str], env: Mapping[str, str], out: IO[Any] | None, err: IO[Any] | None
) -> NoReturn:
    """In the forked child: become ``python -u -m dmlctl.runtime.entry args[4:]``."""
    try:
        os.setsid()
        name_process(f"rank {env.get('RANK', '')}".encode())
        fresh_signals()
        for fd, stream in ((1, out), (2, err)):
            if stream is not None:
                os.dup2(stream.fileno(), fd)
        _close_inherited()
        _restore_cuda_queries()
        if (why := _cuda_unusable()) is not None:
            rank = env.get("RANK")
            os.write(
                2, f"dmlctl: {why} in torchrun: rank {rank} starts as a new interpreter\n".encode()
            )
            os.execve(args[0], args, env)  # the new interpreter after all, same process
        os.environ.clear()
        os.environ.update(env)
        _fresh_interpreter(env)
        from dmlctl.runtime import entry

        entry.run(args[4:])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(1)


def _cuda_unusable() -> str | None:
    """What makes the GPUs unusable in this forked process (then only a new
    interpreter can use them): CUDA initialised, or NVML loaded."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is None:
        return None
    if cuda._is_in_bad_fork():
        return "CUDA was initialised"
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        # (torch links the CUDA driver's library, loaded but idle; NVML is loaded on use)
        if any("libnvidia-ml.so" in line for line in maps):
            return "NVML was loaded"
    return None


def fresh_signals() -> None:
    """Handlers as a new interpreter has them: caught signals back to their default
    (as ``exec`` does), ignored ones still ignored, Python's own three set."""
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
    """Point every descriptor above 2 at ``/dev/null``: torchrun's sockets and pipes
    close in this process, and an object of torchrun's that closes its descriptor
    later closes only that ``/dev/null`` (never a file the script opened)."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != null:
            try:
                os.dup2(null, fd, inheritable=False)
            except OSError:
                continue
    os.close(null)


def _fresh_interpreter(env: Mapping[str, str]) -> None:
    """``sys.path``, threads, stdio, exit handlers and random state as a new
    ``python -u`` started with ``env`` would have them."""
    sys.path[:] = _sys_path(env.get("PYTHONPATH", ""))
    threads = env.get("OMP_NUM_THREADS")
    if threads is not None and threads != STARTUP_ENV.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(int(threads))
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        old = getattr(sys, f"__{name}__") or getattr(sys, name)
        stream = io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False),
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors=getattr(old, "errors", None) or errors,
            write_through=True,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    setattr(sys, "__stdin__", sys.stdin)  # noqa: B010 - typed Final in typeshed
    _fresh_exit_handlers()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _sys_path(pythonpath: str) -> list[str]:
    """``sys.path`` as Python builds it from ``pythonpath``: this one's, with the
    agent's ``PYTHONPATH`` entries replaced by those of ``pythonpath``."""

    def entries(value: str, cwd: str) -> list[str]:
        return [os.path.normpath(os.path.join(cwd, p)) for p in value.split(os.pathsep) if p]

    agent = set(entries(STARTUP_ENV.get("PYTHONPATH", ""), STARTUP_CWD))
    wanted = entries(pythonpath, os.getcwd())
    rest = [p for p in sys.path[1:] if p not in agent and p not in wanted]
    return [sys.path[0], *wanted, *rest]


def _fresh_exit_handlers() -> None:
    """The exit handlers a new interpreter that imported the same modules has (those
    of ``logging``, ``multiprocessing``, torch's data loader and ``weakref.finalize``),
    none of torchrun's or the agent's."""
    import logging
    import multiprocessing.util
    import weakref

    atexit._clear()
    atexit.register(logging.shutdown)
    atexit.register(multiprocessing.util._exit_function)  # type: ignore[attr-defined]
    for module, name in (
        ("torch.utils.data._utils", "_set_python_exit_flag"),
        ("torch._subclasses.fake_tensor", "dump_cache_stats"),
    ):
        if module in sys.modules:
            atexit.register(getattr(sys.modules[module], name))
    if getattr(weakref.finalize, "_registered_with_atexit", False):
        atexit.register(weakref.finalize._exitfunc)  # type: ignore[attr-defined]
