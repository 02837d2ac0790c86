"""The rank entry point torchrun runs: ``python -m dmlctl.runtime.entry SCRIPT ARGS…``.

Promises, for every rank process:

* file descriptors 1 and 2 point at ``rank-<R>.stdout`` / ``rank-<R>.stderr`` in
  ``$DMLCTL_RANK_DIR`` (append mode), so a rank never blocks on a pipe and nothing
  it — or any child it starts — prints is lost;
* before the script runs: ``faulthandler`` dumps every thread's stack into
  ``rank-<R>.stacks`` on :data:`dmlctl.protocol.STACKS_SIGNAL`, a ``start`` record is
  written and the heartbeat (:mod:`dmlctl.runtime.heartbeat`) beats every second;
  the strategy's guards are armed (:mod:`dmlctl.runtime.guards`);
* a worker runs the script exactly as ``python SCRIPT ARGS…`` under torchrun would:
  as ``__main__`` with ``__file__`` its absolute path, ``sys.argv`` = [SCRIPT, ARGS…]
  as given, and its directory first on ``sys.path``. A parameter-server rank never
  runs the script: it serves (``dmlctl.init()``) until the workers are done;
* the process ends the way the interpreter ends under torchrun — non-daemon threads
  joined (pending ``ThreadPoolExecutor`` jobs included), ``atexit`` handlers run,
  output and every file left open flushed — and an ``exit`` record (code 0, or the
  exception's type, message and traceback; and the final collective counts) is
  written: after all that on success, before the ``atexit`` handlers on failure (they
  close the process group, its peers then fail, and torchrun may stop this rank), with
  torchelastic's error file (``$TORCHELASTIC_ERROR_FILE``) so torchrun's own summary
  names the exception. Only the interpreter's final
  teardown is skipped (see :func:`finish`).

Without ``$DMLCTL_RANK_DIR`` it only runs the script and ends as above.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import faulthandler
import gc
import io
import json
import os
import runpy
import shutil
import signal
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader
from typing import IO, Any, NoReturn

from dmlctl import private_files, protocol
from dmlctl.agent.procs import die_with_parent, set_cmdline
from dmlctl.failure import Kind, exception_kind, is_collateral
from dmlctl.runtime.heartbeat import Heartbeat
from dmlctl.runtime.progress import TRACKER
from dmlctl.runtime.where import FrameNamer

TRACEBACK_LINES = 40
_kept: list[Any] = []  # objects that must outlive the script (this module, the stacks file)


@dataclass
class Outcome:
    """How the script ended: exit code and, on failure, {type, message, traceback}."""

    code: int
    error: dict[str, Any] | None = None


@dataclass
class RankFiles:
    """What this rank set up in its rank directory before the script ran."""

    writer: protocol.RankEventWriter
    heartbeat: Heartbeat


def _redirect(rank_dir: str, rank: int) -> None:
    private_files.make_private_dirs(rank_dir)
    for fd, path in (
        (1, protocol.rank_stdout(rank_dir, rank)),
        (2, protocol.rank_stderr(rank_dir, rank)),
    ):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, private_files.PRIVATE_FILE)
        os.dup2(target, fd)
        os.close(target)


def _stack_dumps(rank_dir: str, rank: int) -> None:
    """Dump every thread's stack into ``rank-<R>.stacks`` on the stacks signal."""
    f: IO[bytes] = open(  # noqa: SIM115 - kept open for faulthandler
        protocol.rank_stacks(rank_dir, rank), "ab", buffering=0, opener=private_files.private_opener
    )
    main = threading.main_thread().ident or 0
    f.write(f"dmlctl: rank {rank} pid {os.getpid()} main thread 0x{main:016x}\n".encode())
    faulthandler.register(getattr(signal, protocol.STACKS_SIGNAL), file=f, all_threads=True)
    _kept.append(f)


def _role() -> str:
    try:
        return protocol.local_role(os.environ, int(os.environ.get("LOCAL_RANK", "0")))
    except ValueError:
        return protocol.ROLE_WORKER  # dmlctl.init() reports the bad variable


def setup(rank: int, script: str) -> RankFiles | None:
    """Redirect output, arm stack dumps, record the start and start the heartbeat
    (nothing without ``$DMLCTL_RANK_DIR``)."""
    rank_dir = os.environ.get(protocol.ENV_RANK_DIR)
    if not rank_dir:
        return None
    _redirect(rank_dir, rank)
    _stack_dumps(rank_dir, rank)
    writer = protocol.rank_event_writer(rank_dir, rank)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    writer.start(local_rank, _role(), os.environ.get(protocol.ENV_HOST, ""))
    namer = FrameNamer(os.path.dirname(os.path.abspath(script)))
    return RankFiles(writer, Heartbeat(writer, namer).start())


def _arm_guards(role: str) -> None:
    from dmlctl.runtime import guards
    from dmlctl.runtime.env import chosen_strategy
    from dmlctl.strategies import registry

    try:
        strategy, _module, params = chosen_strategy(os.environ, registry.load)
    except (KeyError, ValueError):
        return  # an unknown strategy or bad parameters: dmlctl.init() names them
    guards.install(
        strategy,
        # in place, workers are replaced through dmlctl's own groups: even ssgd needs
        # ctx.prepare (DDP's default group cannot lose a member)
        needs_runtime=registry.needs_runtime(strategy, params) or protocol.in_place(os.environ),
    )


def run_script(argv: list[str]) -> None:
    """Run ``argv[0]`` as ``__main__`` with ``sys.argv = argv``, as ``python argv…``
    does (``__file__`` absolute, ``sys.argv[0]`` as given)."""
    path = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(path)
    if not os.path.isfile(path):  # a directory or zip file with __main__.py
        runpy.run_path(path, run_name="__main__")
        return
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=path,
        __loader__=SourceFileLoader("__main__", path),
        __spec__=None,
        __package__=None,
        __builtins__=builtins,
    )
    _kept.append(sys.modules.get("__main__"))  # this module: its functions still run
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def _user_frames(exc: BaseException, script: str) -> BaseException:
    """``exc`` with the traceback frames of this wrapper cut off, so the traceback
    starts in the user's script (unchanged if the script is not in it)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return exc.with_traceback(tb) if tb is not None else exc


def _error_record(exc: BaseException) -> dict[str, Any]:
    lines = "".join(traceback.format_exception(exc)).rstrip("\n").split("\n")
    kind = exception_kind(exc)
    return {
        # A full disk is named as such whatever raised it (the policy never restarts it).
        "type": "DiskFull" if kind is Kind.DISK_FULL else type(exc).__qualname__,
        "message": _disk_full_message(exc) if kind is Kind.DISK_FULL else str(exc),
        "traceback": lines[-TRACEBACK_LINES:],
        "kind": kind.value,
        "collateral": is_collateral(type(exc).__qualname__, str(exc)),
    }


def _disk_full_message(exc: BaseException) -> str:
    """A full disk's message, with where: the file the error names, else the room left
    where this rank's output goes (a print into a full rank file names no file)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None or (isinstance(seen, OSError) and seen.filename):
            break
        seen = seen.__cause__ or seen.__context__
    if isinstance(seen, OSError) and seen.filename:
        named = os.fsdecode(seen.filename)
        return str(exc) if named in str(exc) else f"{exc} (writing {named})"
    rank_dir = os.environ.get(protocol.ENV_RANK_DIR)
    try:
        free = shutil.disk_usage(rank_dir).free if rank_dir else None
    except OSError:
        free = None
    if free is None:
        return str(exc)
    return f"{exc} (no file named; this rank's output goes to {rank_dir}: {free} bytes free there)"


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def main(argv: list[str]) -> Outcome:
    """Run ``argv[0]`` with ``argv[1:]`` (a worker) or serve (a parameter server)."""
    script = os.path.abspath(argv[0])
    role = _role()
    try:
        if role == protocol.ROLE_SERVER:
            from dmlctl.runtime.session import init

            init()  # serves until the workers are done, then raises SystemExit(0)
        else:
            _arm_guards(role)
            run_script(argv)
    except SystemExit as e:
        code = _exit_code(e.code)
        if code != 0 and isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        if code == 0:
            return Outcome(0)
        return Outcome(
            code,
            {
                "type": "SystemExit",
                "message": f"exit code {code}",
                "traceback": [],
                "kind": Kind.USER.value,
            },
        )
    except BaseException as e:
        e = _user_frames(e, script)
        traceback.print_exception(e)
        return Outcome(1, _error_record(e))
    return Outcome(0)


def _write_torchelastic_error(error: dict[str, Any]) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    message = {
        "message": f"{error['type']}: {error['message']}",
        "extraInfo": {
            "py_callstack": "\n".join(error["traceback"]),
            "timestamp": str(int(time.time())),
        },
    }
    try:  # whole or absent: torchrun may read it the moment this rank exits
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"message": message}, f)
        os.replace(tmp, path)
    except OSError:
        pass


def _flush() -> None:
    """Flush what the interpreter's teardown would: stdout and stderr, and every file
    the script left open (text layers before the buffers under them)."""
    # type(o), not isinstance(o, …): an instance check may touch attributes of
    # arbitrary objects (and wake their deprecation warnings).
    files = [o for o in gc.get_objects() if issubclass(type(o), io.IOBase)]
    order = (io.TextIOBase, io.BufferedIOBase, io.RawIOBase)
    for kind in order:
        for f in files:
            if issubclass(type(f), kind):
                with contextlib.suppress(Exception):
                    if not f.closed and f.writable():
                        f.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def final_collectives(files: RankFiles | None) -> dict[str, Any] | None:
    """This rank's collective counts now (the script has returned; the process group
    may be gone already, then its last heartbeat's)."""
    from dmlctl.runtime import collectives

    return collectives.snapshot() or (files.heartbeat.last_coll if files is not None else None)


def finish(
    outcome: Outcome, files: RankFiles | None, coll: dict[str, Any] | None = None
) -> NoReturn:
    """End the process as the interpreter would (see the module promises), then
    ``os._exit``: on gloo, a communication thread freed during the interpreter's own
    teardown can abort a rank that has already finished its work
    (pytorch/pytorch#190489), which would turn a successful run into a failed one."""
    failed = outcome.error is not None
    if failed:  # before atexit: see _record
        _record(outcome, files, coll)
    with TRACKER.phase("exit"):  # joining threads may take long: not a hang
        shutdown = getattr(threading, "_shutdown", None)
        if callable(shutdown):
            shutdown()  # runs threading's atexit hooks (executors), joins non-daemon threads
        atexit._run_exitfuncs()
    _done_with_store()
    _flush()
    if not failed:
        _record(outcome, files, coll)
    os._exit(outcome.code)


def _done_with_store() -> None:
    """In a run that replaces lost ranks in place, say in the run's store that this
    rank is done with it (:func:`dmlctl.runtime.rejoin.done`): its torchrun waits for
    that of every rank. Best effort: a store gone means the run is ending anyway."""
    if not protocol.in_place(os.environ) or "MASTER_PORT" not in os.environ:
        return
    with contextlib.suppress(Exception):
        from dmlctl.runtime import rejoin

        rejoin.done()


def _record(outcome: Outcome, files: RankFiles | None, coll: dict[str, Any] | None) -> None:
    """Write the ``exit`` record (and, on failure, torchelastic's error file). A failed
    rank writes them before its ``atexit`` handlers run: those close its process group
    (``ctx.close``), its peers' collectives then fail at once, and torchrun may stop
    this rank before a later record — leaving the peers' collateral errors as the only
    explanation of the run's failure."""
    if outcome.error is not None:
        _write_torchelastic_error(outcome.error)
    if files is not None:
        files.heartbeat.stop()
        files.writer.exit(outcome.code, outcome.error, coll)
        files.writer.close()


def die_with_torchrun() -> None:
    """End this rank (SIGKILL) when the torchrun that started it ends, or now if it
    has already ended: torchrun ends its ranks before it exits, so a rank whose
    torchrun is gone was left behind by a torchrun killed from outside (or by its
    agent's death), and must not go on training or writing checkpoints for an attempt
    that is over. Torchrun is gone when this process's parent is init or the host
    agent (the subreaper its orphans go to)."""
    parent = os.getppid()
    agent = os.environ.get(protocol.ENV_AGENT_PID, "")
    if parent == 1 or str(parent) == agent:
        os.kill(os.getpid(), signal.SIGKILL)
    die_with_parent(signal.SIGKILL, parent)


def show_as_script(argv: list[str]) -> None:
    """Show this process in ``ps`` as torchrun's rank would be: ``PYTHON -u SCRIPT
    ARGS…``, without this entry's ``-m dmlctl.runtime.entry`` (tools that find ranks
    by their script's name find them)."""
    with contextlib.suppress(OSError), open("/proc/self/cmdline", "rb") as f:
        interpreter = f.read().split(b"\0", 1)[0].decode(errors="replace")
        set_cmdline([interpreter or sys.executable, "-u", *argv])


def run(argv: list[str]) -> NoReturn:
    """Be the rank that runs ``argv`` (``SCRIPT ARGS…``), from setup to ``os._exit``."""
    show_as_script(argv)
    if protocol.ENV_RANK_DIR in os.environ:
        die_with_torchrun()
    files = setup(int(os.environ.get("RANK", "0")), argv[0])
    outcome = main(argv)
    finish(outcome, files, final_collectives(files))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: python -m dmlctl.runtime.entry SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    run(sys.argv[1:])
