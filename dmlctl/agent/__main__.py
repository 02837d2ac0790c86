"""The host agent: ``python -m dmlctl.agent --run-id RUN``, one per host per run.

The run id on the command line is only a label (``ps`` shows whose agent it is).

Contract:

* Reads its configuration as the first line of stdin (JSON, see
  ``HostPlan.agent_config``) — never from its command line, so no secret is visible
  in ``ps``.
* Runs in a session of its own (the transport starts it so), becomes the child
  subreaper of everything it starts, writes ``agent.pid`` into the rank directory,
  and runs torchrun in the job's directory (``~`` expanded) with its own dmlctl
  first on ``PYTHONPATH``.
* Streams every rank's output and records (see :mod:`dmlctl.protocol`) and
  torchrun's own output to its stdout as JSON lines, ending with one ``exit`` message.
* Imports torchrun before it reads its configuration and runs it in a forked child
  instead of a new interpreter (:mod:`dmlctl.agent.warm`), so an agent the
  controller starts ahead of time (a standby for the next restart) saves a restart
  torchrun's start-up.
* Stops the run — SIGTERM to its whole process tree, SIGKILL after a grace period —
  when stdin says ``stop``, when stdin closes or its parent (sshd's session)
  goes away (the controller or the SSH connection is gone), or on
  SIGTERM/SIGHUP/SIGINT. When it exits, none of its processes is left.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any, TextIO

from dmlctl import protocol
from dmlctl.agent import warm
from dmlctl.agent.procs import become_subreaper, kill_tree
from dmlctl.agent.tail import RankDirTailer

POLL_S = 0.05
STOP_GRACE_S = 3.0
TAIL = 40
SUMMARY_LINES = 2000
ALIVE_S = 1.0  # a message at least this often, so a silent host can be told from a busy one


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


def _forward_torchrun(
    stream: TextIO,
    emit: Emitter,
    tail: collections.deque[str],
    stop: threading.Event,
    summary: collections.deque[str] | None = None,
) -> None:
    for line in stream:
        text = line.rstrip("\n")
        tail.append(text)
        if summary is not None and protocol.is_failure_summary_line(text):
            summary.append(text)
        # Once we stop torchrun ourselves, what it prints is its own shutdown noise
        # (a SignalException traceback): kept in the exit message's tail, not streamed.
        if not stop.is_set():
            emit.send(protocol.MSG_LOG, r=None, s="agent", l=[text])


def _watch_stdin(stop: threading.Event, reason: list[str]) -> None:
    for line in sys.stdin:
        if line.strip() == "stop":
            reason.append("stop requested")
            stop.set()
            return
    reason.append("controller connection closed")
    stop.set()


def _emit_ranks(tailer: RankDirTailer, emit: Emitter, final: bool = False) -> bool:
    """Forward new rank output; True if anything was read."""
    records: list[str] = []
    any_data = False
    for rank, kind, lines in tailer.poll(final=final):
        any_data = True
        if kind == "events.jsonl":
            records += [rec for rec in lines if rec.strip()]
        else:
            emit.send(protocol.MSG_LOG, r=rank, s=kind, l=lines)
    # Output first, then records: a rank's last lines arrive before its exit.
    for rec in records:
        emit.raw('{"k":"rank","rec":' + rec + "}")
    return any_data


def run(config: dict[str, Any], emit: Emitter, stop: threading.Event, reason: list[str]) -> int:
    """Run torchrun under supervision; returns torchrun's exit code (or 127/130)."""
    rank_dir = os.path.expanduser(config["rank_dir"])
    workdir = os.path.expanduser(config["workdir"])
    os.makedirs(rank_dir, exist_ok=True)
    with open(os.path.join(rank_dir, "agent.pid"), "w", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")
    env = {**os.environ, **config["env"], protocol.ENV_RANK_DIR: rank_dir}
    for key in (protocol.ENV_CHECKPOINT_DIR,):  # remote paths may start with ~/
        if key in env:
            env[key] = os.path.expanduser(env[key])
    # Ranks import the same dmlctl as this agent (on a remote host: the shipped copy).
    here = os.path.dirname(os.path.dirname(os.path.abspath(protocol.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL)
    # torchrun's failure summary ("rank : N" / "exitcode : X" per failed rank) can start
    # far above the tail when other ranks' tracebacks follow it: kept on its own.
    summary: collections.deque[str] = collections.deque(maxlen=SUMMARY_LINES)
    proc: subprocess.Popen[str] | warm.ForkedTorchrun
    try:
        if warm.can_fork(config["argv"]):
            proc = warm.ForkedTorchrun(config["argv"], workdir, env)
            emit.send(protocol.MSG_LOG, r=None, s="agent", l=["dmlctl agent: warm start"])
        else:
            proc = subprocess.Popen(
                config["argv"],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
    except OSError as e:
        emit.send(protocol.MSG_EXIT, code=127, tail=[f"cannot start torchrun: {e}"], stopped=False)
        return 127
    emit.send(protocol.MSG_AGENT, state="started", pid=os.getpid(), torchrun_pid=proc.pid)
    assert proc.stdout is not None
    reader = threading.Thread(
        target=_forward_torchrun, args=(proc.stdout, emit, tail, stop, summary), daemon=True
    )
    reader.start()
    tailer = RankDirTailer(rank_dir)
    stopped = False
    parent = os.getppid()
    alive_at = time.monotonic() + ALIVE_S
    while True:
        busy = _emit_ranks(tailer, emit)
        if time.monotonic() >= alive_at:  # the controller counts a silent host as lost
            emit.send(protocol.MSG_AGENT, state="alive")
            alive_at = time.monotonic() + ALIVE_S
        if proc.poll() is not None:
            break
        if os.getppid() != parent and not stop.is_set():
            reason.append("controller connection lost (parent process gone)")
            stop.set()
        if stop.is_set():
            stopped = True
            why = reason[0] if reason else "controller connection lost"
            emit.send(protocol.MSG_LOG, r=None, s="agent", l=[f"dmlctl agent: {why}; stopping"])
            kill_tree(os.getpid(), STOP_GRACE_S, keep=frozenset({proc.pid}))
            proc.wait()
            break
        if not busy:
            time.sleep(POLL_S)
    reader.join(5.0)
    _emit_ranks(tailer, emit, final=True)
    tailer.close()
    kill_tree(os.getpid(), 1.0)  # anything a rank left behind (daemons, grandchildren)
    code = int(proc.returncode) if proc.returncode is not None else 1
    emit.send(
        protocol.MSG_EXIT, code=code, tail=list(tail), summary=list(summary), stopped=stopped
    )
    return code


def main() -> int:
    stop = threading.Event()
    reason: list[str] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        reason.append(f"received {signal.Signals(signum).name}")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    warm.preload()  # torchrun runs forked from this process: see dmlctl.agent.warm
    first = sys.stdin.readline()
    if not first:
        return 2
    config = json.loads(first)
    emit = Emitter(sys.stdout, stop)
    become_subreaper()
    threading.Thread(target=_watch_stdin, args=(stop, reason), daemon=True).start()
    code = run(config, emit, stop, reason)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    status = main()
    # Everything it started is gone and its last message is out: skip the teardown
    # of an interpreter holding torch (tenths of a second the controller would wait).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
