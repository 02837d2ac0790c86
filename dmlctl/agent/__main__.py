"""The host agent: ``python -m dmlctl.agent --run-id RUN``, one per host per run.

The run id on the command line is only a label (``ps`` shows whose agent it is).

Contract:

* Reads its configuration as the first line of stdin (a
  :class:`~dmlctl.AgentConfig` as JSON) — never from its command line, so
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
* Runs torchrun with dmlctl's elastic agent (:mod:`dmlctl.agent.torchrun`) as a new
  process, whose ranks start as new interpreters, as torchrun starts them. With
  ``--warm`` on its command line (the job's ``ranks.start: warm``) it first forks the
  zygote (:mod:`dmlctl.agent.zygote`), which imports torch while the configuration
  is awaited and then forks torchrun and its ranks.
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

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from dmlctl import run_key, wire
from dmlctl.agent import zygote
from dmlctl.agent.forward import Held, drain, dump, emit_ranks, rank_usage
from dmlctl.agent.messages import Commands, Emitter, Output, forward_torchrun, watch_stdin
from dmlctl.agent.procs import alive, become_subreaper, kill_tree, name_process
from dmlctl.agent.start import Torchrun, cannot_start, environment, prepare, script_dir, start
from dmlctl.agent.tail import RankDirTailer
from dmlctl.agent.torchrun import read_failures
from dmlctl.agent.zygote_client import Client
from dmlctl.agent_config import WARM_FLAG, AgentConfig
from dmlctl.masking import mask_files
from dmlctl.redact import Redactor
from dmlctl.runtime.where import FrameNamer

POLL_S = 0.05
NO_RANK_GRACE_S = 0.5
"""On a stop with no rank process left: how long torchrun gets to end by itself (one
waiting in a barrier of its store's never does before its timeout)."""
ALIVE_S = 1.0  # a message at least this often, so a silent host can be told from a busy one


def run(
    config: AgentConfig,
    emit: Emitter,
    commands: Commands,
    forks: Client | None = None,
    warm: bool = False,
) -> int:
    """Run torchrun under supervision (forked by the zygote behind ``forks`` where
    there is one, which with ``warm`` forks its ranks too); returns torchrun's exit
    code (or 127)."""
    rank_dir = prepare(config, emit)
    if rank_dir is None:
        return 127
    workdir = os.path.expanduser(config.workdir)
    try:
        proc = start(config, workdir, environment(config, rank_dir), emit, forks, warm)
    except (OSError, ValueError) as e:
        cannot_start(emit, "cannot start torchrun", e)
        return 127
    emit.send(wire.AgentMsg("started", pid=os.getpid(), torchrun_pid=proc.pid))
    assert proc.stdout is not None
    out = Output()
    reader = threading.Thread(
        target=forward_torchrun,
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
    drain(tailer, emit, pids, held)  # after: nothing writes to the rank files any more
    tailer.close()
    with contextlib.suppress(OSError):  # no rank of this attempt is left to read it
        os.unlink(os.path.join(rank_dir, run_key.KEY_FILE))
    _mask(rank_dir, Redactor(config.masked))
    code = int(proc.returncode) if proc.returncode is not None else 1
    failures = read_failures(rank_dir, str(config.attempt + 1)) if code != 0 else ()
    emit.send(wire.ExitMsg(code, tuple(out.tail), tuple(out.summary), stopped, None, failures))
    return code


def _mask(rank_dir: str, redactor: Redactor) -> None:
    """Hide the run's secrets in what this attempt's ranks and torchrun wrote: its
    rank files (not those of the later attempts and replacements, in folders below,
    whose ranks may still write) and torchrun's error files."""
    mask_files(Path(rank_dir), redactor, deep=False)
    mask_files(Path(rank_dir) / "torchrun", redactor)


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
    """Stream the ranks until torchrun ends; carry out stops (the ranks get the grace,
    torchrun :data:`NO_RANK_GRACE_S` once no rank runs) and dumps. True if stopped."""
    alive_at = time.monotonic() + ALIVE_S
    kill_at: float | None = None
    stopped_at = 0.0
    while True:
        busy = emit_ranks(tailer, emit, pids, held=held)
        if time.monotonic() >= alive_at:  # the controller counts a silent host as lost
            emit.send(wire.AgentMsg("alive", procs=rank_usage(pids)))
            alive_at = time.monotonic() + ALIVE_S
        if proc.poll() is not None:
            return kill_at is not None
        if commands.controller_gone() and not commands.stop.is_set():
            commands.reason.append("controller connection lost (parent process gone)")
            commands.stop.set()
        if commands.dump.is_set():  # in a thread: keepalives and output go on meanwhile
            commands.dump.clear()
            namer = FrameNamer(script_dir(config, os.path.expanduser(config.workdir)))
            threading.Thread(
                target=dump, args=(dict(pids), rank_dir, namer, emit), daemon=True
            ).start()
        if commands.stop.is_set() and kill_at is None:
            grace = commands.grace
            grace = config.stop_grace if grace is None else grace
            why = commands.reason[0] if commands.reason else "controller connection lost"
            running = any(alive(pid) for pid in pids.values())
            given = f"ranks get {grace:g} s" if running else "no rank runs"
            said = f"dmlctl agent: {why}; stopping ({given})"
            emit.send(wire.LogMsg(None, "agent", (said,)))
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)  # torchrun passes it on to every rank
            stopped_at = time.monotonic()
            kill_at = stopped_at + grace
        if kill_at is not None and not any(alive(pid) for pid in pids.values()):
            kill_at = min(kill_at, stopped_at + NO_RANK_GRACE_S)  # nothing left to save
        if kill_at is not None and time.monotonic() >= kill_at:
            kill_tree(os.getpid(), 1.0, keep=frozenset({proc.pid}))
            proc.wait()
            return True
        if not busy:
            time.sleep(POLL_S)


def main(watch_parent: bool = True, starter: int | None = None) -> int:
    """Run the agent on this process's stdin and stdout; its exit code. Without
    ``watch_parent`` (an agent forked by :mod:`dmlctl.agent.server`, whose parent is
    that server) stdin's end says that the controller is gone, and so does the end of
    ``starter`` where one is given (:mod:`dmlctl.agent.served`)."""
    name_process(b"dmlctl-agent")  # ps -o comm, top: not one more python3
    parent = os.getppid() if watch_parent else None
    stop = threading.Event()
    reason: list[str] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        reason.append(f"received {signal.Signals(signum).name}")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    # The zygote imports torch while the configuration is awaited: forked now, while
    # this process has its only thread (a standby that is never used ends it unused).
    warm = WARM_FLAG in sys.argv[1:]
    forked = zygote.start(warm)
    first = sys.stdin.readline()
    if not first:
        return 2
    emit = Emitter(sys.stdout, stop)
    config = AgentConfig.from_json(first)
    become_subreaper()
    commands = Commands(stop, reason, parent, starter)
    threading.Thread(target=watch_stdin, args=(commands,), daemon=True).start()
    client = Client(forked) if forked is not None else None
    if client is not None:  # the controller counts a silent host as lost
        client.wait_ready(ALIVE_S, lambda: emit.send(wire.AgentMsg("alive")))
    code = run(config, emit, commands, client, warm)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    status = main()
    # Everything it started is gone and its last message is out: skip the teardown
    # of an interpreter holding torch (tenths of a second the controller would wait).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
