"""The host agent: ``python -m dmlctl.agent --run-id RUN``, one per host per run.

The run id on the command line is only a label (``ps`` shows whose agent it is).

Contract:

* Reads its configuration as the first line of stdin (a
  :class:`~dmlctl.protocol.AgentConfig` as JSON) — never from its command line, so
  no secret is visible in ``ps``. The ranks get the config's environment, attempt,
  rank directory and strategy parameters (:meth:`AgentConfig.rank_env`).
* Runs in a session of its own (the transport starts it so), becomes the child
  subreaper of everything it starts, writes ``agent.pid`` into the rank directory,
  has the kernel SIGKILL its torchrun if the agent itself dies (a ``kill -9``; each
  rank in turn dies with its torchrun, :func:`dmlctl.runtime.entry.die_with_torchrun`),
  and runs torchrun in the job's directory (``~`` expanded) with its own dmlctl
  first on ``PYTHONPATH``.
* Streams every rank's output and records (see :mod:`dmlctl.protocol`) and
  torchrun's own output to its stdout as JSON lines, ending with one ``exit`` message.
* Imports torchrun (and ``torch._dynamo``, which every rank's optimizer imports)
  before it reads its configuration and runs torchrun in a forked child
  instead of a new interpreter (:mod:`dmlctl.agent.warm`), so an agent the
  controller starts ahead of time (a standby for the next restart) saves a restart
  torchrun's start-up; that torchrun forks the ranks in turn
  (:mod:`dmlctl.agent.forked_rank`), so no rank imports torch again.
* Stops the run when stdin says ``stop [GRACE]``, when stdin closes or its parent
  (sshd's session) goes away (the controller or the SSH connection is gone), or on
  SIGTERM/SIGHUP/SIGINT: SIGTERM to torchrun, which passes it to every rank and
  waits for them (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``); the ranks' output keeps
  streaming meanwhile; after GRACE seconds (default: the config's ``stop_grace``)
  SIGKILL to whatever is left. When it exits, none of its processes is left.
* On ``dump`` it has every rank write its Python stacks (:mod:`dmlctl.agent.stacks`)
  and streams them back, then says ``dumped``.
* Every byte a rank wrote reaches stdout before the ``exit`` message: the rank files
  are read to their end, in bounded chunks, after torchrun has ended.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any, TextIO

from dmlctl import protocol
from dmlctl.agent import warm
from dmlctl.agent.procs import become_subreaper, descendants, dies_with_parent, kill_tree
from dmlctl.agent.stacks import dump_stacks, main_thread_frames
from dmlctl.agent.tail import RankDirTailer
from dmlctl.agent.usage import usage
from dmlctl.protocol import AgentConfig
from dmlctl.runtime.where import FrameNamer

POLL_S = 0.05
TAIL = 40
SUMMARY_LINES = 2000
ALIVE_S = 1.0  # a message at least this often, so a silent host can be told from a busy one

Torchrun = subprocess.Popen[str] | warm.ForkedTorchrun


class Emitter:
    """Thread-safe writer of agent messages; notes when the controller is gone."""

    def __init__(self, out: TextIO, gone: threading.Event) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._gone = gone

    def raw(self, line: str) -> None:
        with self._lock:
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._gone.set()

    def send(self, kind: str, **fields: Any) -> None:
        self.raw(protocol.encode_agent_message(kind, **fields))


_REPORT_START = re.compile(r"failed \(exitcode: -?\d+\)|Sending process \d+ closing signal")
"""A line of torchrun's that starts its report of a failed worker (sent as the
``torchrun`` stream: logged, not shown)."""


def _forward_torchrun(
    stream: TextIO,
    emit: Emitter,
    tail: collections.deque[str],
    stop: threading.Event,
    summary: collections.deque[str] | None = None,
) -> None:
    source = "agent"
    for line in stream:
        text = line.rstrip("\n")
        tail.append(text)
        if summary is not None and protocol.is_failure_summary_line(text):
            summary.append(text)
        if _REPORT_START.search(text):
            source = "torchrun"  # from here on: its report of a failed worker
        # Once we stop torchrun ourselves, what it prints is its own shutdown noise
        # (a SignalException traceback): kept in the exit message's tail, not streamed.
        if not stop.is_set():
            emit.send(protocol.MSG_LOG, r=None, s=source, l=[text])


class Commands:
    """What the controller asked for on stdin (set by :func:`_watch_stdin`)."""

    def __init__(self, stop: threading.Event, reason: list[str]) -> None:
        self.stop = stop
        self.reason = reason
        self.grace: float | None = None  # seconds the stop gives the ranks
        self.dump = threading.Event()


def _watch_stdin(commands: Commands) -> None:
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["dump"]:
            commands.dump.set()
        elif words[:1] == ["stop"]:
            with contextlib.suppress(ValueError, IndexError):
                commands.grace = max(0.0, float(words[1]))
            commands.reason.append("stop requested")
            commands.stop.set()
    commands.reason.append("controller connection closed")
    commands.stop.set()


class Held:
    """Exit records waiting for the rest of their rank's output (rank → records)."""

    def __init__(self) -> None:
        self.exits: dict[int, list[str]] = {}


def _emit_ranks(
    tailer: RankDirTailer,
    emit: Emitter,
    pids: dict[int, int],
    final: bool = False,
    held: Held | None = None,
) -> bool:
    """Forward new rank output (noting each rank's pid in ``pids``); True if anything
    was read. A rank's ``exit`` record waits in ``held`` until its stdout and stderr
    have been read to their end, so its last lines (its traceback) come first."""
    records: list[str] = []
    any_data = False
    for rank, kind, lines in tailer.poll(final=final):
        any_data = True
        if kind == "events.jsonl":
            records += [rec for rec in lines if rec.strip()]
        else:
            emit.send(protocol.MSG_LOG, r=rank, s=kind, l=lines)
    held = held if held is not None else Held()
    for rank in [r for r in held.exits if r not in tailer.behind]:
        records += held.exits.pop(rank)
    for rec in records:
        exiting = _rank_of(rec) if '"kind":"exit"' in rec else None
        if exiting is not None and exiting in tailer.behind:
            held.exits.setdefault(exiting, []).append(rec)
            continue
        if '"kind":"start"' in rec:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                start = json.loads(rec)
                pids[int(start["rank"])] = int(start["pid"])
        emit.raw('{"k":"rank","rec":' + rec + "}")
    return any_data


def _rank_of(record: str) -> int | None:
    try:
        return int(json.loads(record)["rank"])
    except (ValueError, KeyError, TypeError):
        return None


def _drain(tailer: RankDirTailer, emit: Emitter, pids: dict[int, int], held: Held) -> None:
    """Forward everything the ranks wrote, to the end of every file."""
    while _emit_ranks(tailer, emit, pids, held=held) or held.exits:
        pass
    _emit_ranks(tailer, emit, pids, final=True, held=held)


def _usage(pids: dict[int, int]) -> dict[int, list[Any]]:
    """Every rank's ``[state, CPU seconds, I/O bytes]`` (of its process tree), now."""
    out: dict[int, list[Any]] = {}
    for rank, pid in pids.items():
        found = usage(pid)
        if found is not None:
            out[rank] = [found[0], round(found[1], 3), found[2]]
    return out


def _dump(pids: dict[int, int], rank_dir: str, namer: FrameNamer, emit: Emitter) -> None:
    """Every rank's stacks, each with where its main thread is, then ``dumped``. Only
    processes of this agent's own tree are signalled (a pid may have been reused)."""
    mine = set(descendants(os.getpid()))
    dumps, stopped = dump_stacks({r: p for r, p in pids.items() if p in mine}, rank_dir)
    for rank, lines in sorted(dumps.items()):
        where, inner = namer.summary(main_thread_frames(lines))
        emit.send(protocol.MSG_STACKS, r=rank, l=lines, where=where, inner=inner)
    emit.send(protocol.MSG_AGENT, state="dumped", stopped=stopped)


def _script_dir(config: AgentConfig, workdir: str) -> str:
    """The directory of the training script."""
    return os.path.dirname(os.path.join(workdir, config.torchrun.script))


def _environment(config: AgentConfig, rank_dir: str) -> dict[str, str]:
    """torchrun's environment: the agent's, the config's (:meth:`AgentConfig.rank_env`)
    with the rank directory expanded, this dmlctl first on ``PYTHONPATH`` and the stop
    grace as torchrun's shutdown timeout."""
    env = {
        **os.environ,
        **config.rank_env(),
        protocol.ENV_RANK_DIR: rank_dir,
        protocol.ENV_AGENT_PID: str(os.getpid()),
    }
    for key in (protocol.ENV_CHECKPOINT_DIR,):  # remote paths may start with ~/
        if key in env:
            env[key] = os.path.expanduser(env[key])
    # Ranks import the same dmlctl as this agent (on a remote host: the shipped copy).
    here = os.path.dirname(os.path.dirname(os.path.abspath(protocol.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(max(1, math.ceil(config.stop_grace))))
    return env


def _start(config: AgentConfig, workdir: str, env: dict[str, str], emit: Emitter) -> Torchrun:
    """torchrun, forked from this warm process when possible, else a new process."""
    argv = config.torchrun.argv()
    if warm.can_fork(argv):
        forked = warm.ForkedTorchrun(argv, workdir, env)
        emit.send(protocol.MSG_LOG, r=None, s="agent", l=["dmlctl agent: warm start"])
        return forked
    return subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        preexec_fn=dies_with_parent(signal.SIGKILL, os.getpid()),
    )


# Errors that come and go (out of processes or memory for a moment): the host's fault.
_TRANSIENT = (errno.EAGAIN, errno.ENOMEM, errno.EINTR)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _cannot_start(emit: Emitter, what: str, exc: OSError | ValueError) -> None:
    """The ``exit`` message of an agent that could not start its run, with the error:
    ``DiskFull``, ``AgentExit`` (transient) or ``SpecInvalid`` — the planned command,
    environment or directory cannot work (a restart would fail the same way)."""
    code = exc.errno if isinstance(exc, OSError) else None
    kind = "DiskFull" if code in _FULL else "AgentExit" if code in _TRANSIENT else "SpecInvalid"
    message = f"{what}: {exc}"
    emit.send(
        protocol.MSG_EXIT,
        code=127,
        tail=[message],
        stopped=False,
        error={"type": kind, "message": message},
    )


def _prepare(config: AgentConfig, emit: Emitter) -> str | None:
    """The rank directory (``~`` expanded, made private) holding ``agent.pid``; None
    (after the ``exit`` message saying why) when it cannot be made. The checkpoint
    directory is made too when it can be (the ranks never make it again once it was
    there: see :class:`dmlctl.runtime.checkpoint.CheckpointManager`)."""
    rank_dir = os.path.expanduser(config.rank_dir)
    checkpoints = config.rank_env().get(protocol.ENV_CHECKPOINT_DIR)
    if checkpoints:
        with contextlib.suppress(OSError):  # the ranks say why, at their first save
            protocol.make_private_dirs(os.path.expanduser(checkpoints))
    try:
        protocol.make_private_dirs(rank_dir)
        path = os.path.join(rank_dir, "agent.pid")
        with open(path, "w", encoding="ascii", opener=protocol.private_opener) as f:
            f.write(f"{os.getpid()}\n")
    except OSError as e:
        _cannot_start(emit, f"cannot make the rank directory {rank_dir}", e)
        return None
    return rank_dir


class Output:
    """What torchrun printed, kept for the ``exit`` message: its last lines, and its
    failure summary ("rank : N" / "exitcode : X" per failed rank), which can start far
    above the tail when other ranks' tracebacks follow it."""

    def __init__(self) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL)
        self.summary: collections.deque[str] = collections.deque(maxlen=SUMMARY_LINES)


def run(config: AgentConfig, emit: Emitter, commands: Commands) -> int:
    """Run torchrun under supervision; returns torchrun's exit code (or 127)."""
    rank_dir = _prepare(config, emit)
    if rank_dir is None:
        return 127
    workdir = os.path.expanduser(config.workdir)
    try:
        proc = _start(config, workdir, _environment(config, rank_dir), emit)
    except (OSError, ValueError) as e:
        _cannot_start(emit, "cannot start torchrun", e)
        return 127
    emit.send(protocol.MSG_AGENT, state="started", pid=os.getpid(), torchrun_pid=proc.pid)
    assert proc.stdout is not None
    out = Output()
    reader = threading.Thread(
        target=_forward_torchrun,
        args=(proc.stdout, emit, out.tail, commands.stop, out.summary),
        daemon=True,
    )
    reader.start()
    tailer = RankDirTailer(rank_dir)
    pids: dict[int, int] = {}
    held = Held()
    stopped = _supervise(proc, config, tailer, emit, commands, pids, rank_dir, held)
    reader.join(5.0)
    kill_tree(os.getpid(), 1.0)  # anything a rank left behind (daemons, grandchildren)
    _drain(tailer, emit, pids, held)  # after: nothing writes to the rank files any more
    tailer.close()
    code = int(proc.returncode) if proc.returncode is not None else 1
    emit.send(
        protocol.MSG_EXIT,
        code=code,
        tail=list(out.tail),
        summary=list(out.summary),
        stopped=stopped,
    )
    return code


def _supervise(
    proc: Torchrun,
    config: AgentConfig,
    tailer: RankDirTailer,
    emit: Emitter,
    commands: Commands,
    pids: dict[int, int],
    rank_dir: str,
    held: Held,
) -> bool:
    """Stream the ranks until torchrun ends; carry out stops and dumps. True if stopped."""
    parent = os.getppid()
    alive_at = time.monotonic() + ALIVE_S
    kill_at: float | None = None
    while True:
        busy = _emit_ranks(tailer, emit, pids, held=held)
        if time.monotonic() >= alive_at:  # the controller counts a silent host as lost
            emit.send(protocol.MSG_AGENT, state="alive", procs=_usage(pids))
            alive_at = time.monotonic() + ALIVE_S
        if proc.poll() is not None:
            return kill_at is not None
        if os.getppid() != parent and not commands.stop.is_set():
            commands.reason.append("controller connection lost (parent process gone)")
            commands.stop.set()
        if commands.dump.is_set():  # in a thread: keepalives and output go on meanwhile
            commands.dump.clear()
            namer = FrameNamer(_script_dir(config, os.path.expanduser(config.workdir)))
            threading.Thread(
                target=_dump, args=(dict(pids), rank_dir, namer, emit), daemon=True
            ).start()
        if commands.stop.is_set() and kill_at is None:
            grace = commands.grace
            grace = config.stop_grace if grace is None else grace
            why = commands.reason[0] if commands.reason else "controller connection lost"
            emit.send(
                protocol.MSG_LOG,
                r=None,
                s="agent",
                l=[f"dmlctl agent: {why}; stopping (ranks get {grace:g} s)"],
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)  # torchrun passes it on to every rank
            kill_at = time.monotonic() + grace
        if kill_at is not None and time.monotonic() >= kill_at:
            kill_tree(os.getpid(), 1.0, keep=frozenset({proc.pid}))
            proc.wait()
            return True
        if not busy:
            time.sleep(POLL_S)


def main() -> int:
    stop = threading.Event()
    reason: list[str] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        reason.append(f"received {signal.Signals(signum).name}")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    # torchrun runs forked from this process (see dmlctl.agent.warm): import it while
    # the configuration is awaited; a standby that is never used exits at once.
    preload = threading.Thread(target=warm.preload, daemon=True)
    preload.start()
    first = sys.stdin.readline()
    if not first:
        return 2
    emit = Emitter(sys.stdout, stop)
    # Never fork while another thread imports; the controller counts a silent host as lost.
    warm.await_preload(preload, ALIVE_S, lambda: emit.send(protocol.MSG_AGENT, state="alive"))
    config = AgentConfig.from_json(first)
    become_subreaper()
    commands = Commands(stop, reason)
    threading.Thread(target=_watch_stdin, args=(commands,), daemon=True).start()
    code = run(config, emit, commands)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    status = main()
    # Everything it started is gone and its last message is out: skip the teardown
    # of an interpreter holding torch (tenths of a second the controller would wait).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
