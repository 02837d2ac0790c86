"""Scripted transports for tests: the :class:`~dmlctl.transport.base.Transport`
interface without processes, SSH or sleeps.

A :class:`ScriptedTransport` hands out :class:`ScriptedProcess` objects that replay
agent output lines given up front and record every line the controller sends. The
``agent_*`` helpers build those lines in the exact wire format of the real host agent
(:mod:`dmlctl.agent.__main__`, :mod:`dmlctl.protocol`), so a test reads like the run
it describes::

    t = ScriptedTransport("a", agent_lines(ranks=[0, 1], logs={0: ["hello"]}))
    Supervisor(plan, run, {"a": t}, sink).run()
    assert t.process.config["torchrun"]["nproc"] == plan.hosts[0].nproc

Nothing here imports torch or starts a process.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from dmlctl import protocol, wire
from dmlctl.failure import is_collateral, named_kind
from dmlctl.transport.base import Command, Outcome, Process, Transport

STOP = "stop"
"""What the controller sends an agent to stop it."""

STOPPED_EXIT_LINE = wire.encode(wire.ExitMsg(-15, stopped=True))
"""The exit message a hanging :class:`ScriptedProcess` prints once told to stop."""

KILLED_CODE = -9
"""What :meth:`ScriptedProcess.wait` returns after :meth:`ScriptedProcess.kill`."""

STOPPED_CODE = 1
"""What :meth:`ScriptedProcess.wait` returns after a stop (the agent exits 1 then)."""

DEFAULT_TS = 1_700_000_000.0


class ScriptedProcess:
    """A host agent that prints ``lines`` and then ends with ``exit_code``.

    Promises:

    * :meth:`lines` yields the scripted lines in order, each once (one reader);
    * :attr:`sent` holds every line passed to :meth:`send`, in order; the first one
      is the agent configuration, available parsed as :attr:`config`;
    * with ``hang=True``, :meth:`lines` blocks after the scripted lines until
      ``"stop"`` was sent (then yields :data:`STOPPED_EXIT_LINE`) or :meth:`kill`
      was called (then yields nothing more); with ``ignore_stop=True`` as well, only
      :meth:`kill` ends it (an agent that does not answer a stop);
    * :meth:`kill` also ends a non-hanging replay early; :meth:`send` returns False
      once stdin is closed or the process was killed;
    * :meth:`wait` returns None while :meth:`lines` has more to give, then the exit
      code: ``exit_code``, :data:`STOPPED_CODE` after a stop, :data:`KILLED_CODE`
      after a kill.
    """

    def __init__(
        self,
        host: str,
        lines: Sequence[str],
        *,
        exit_code: int = 0,
        hang: bool = False,
        ignore_stop: bool = False,
        stderr: Sequence[str] = (),
        argv: Sequence[str] = (),
        cwd: str | None = None,
    ) -> None:
        self.host = host
        self.argv = tuple(argv)
        self.cwd = cwd
        self.sent: list[str] = []
        self.killed = False
        self.stopped = False
        self.stdin_closed = False
        self._script = list(lines)
        self._exit_code = exit_code
        self._hang = hang
        self._ignore_stop = ignore_stop
        self._stderr = list(stderr)
        self._cond = threading.Condition()
        self._done = False

    @property
    def config(self) -> dict[str, Any]:
        """The agent configuration: the first line sent, parsed (KeyError if none)."""
        with self._cond:
            if not self.sent:
                raise KeyError("nothing was sent to the agent")
            first = self.sent[0]
        parsed: dict[str, Any] = json.loads(first)
        return parsed

    @property
    def done(self) -> bool:
        """True once :meth:`lines` has nothing more to yield."""
        with self._cond:
            return self._done

    def lines(self) -> Iterator[str]:
        """The scripted lines (see the class promises)."""
        try:
            for line in self._script:
                with self._cond:
                    if self.killed:
                        return
                yield line
            if not self._hang:
                return
            with self._cond:
                self._cond.wait_for(lambda: self.stopped or self.killed)
                stopped = self.stopped and not self.killed
            if stopped:
                yield STOPPED_EXIT_LINE
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def send(self, line: str) -> bool:
        """Record ``line``; ``"stop [GRACE]"`` (after the configuration) stops a hanging
        agent."""
        with self._cond:
            if self.stdin_closed or self.killed:
                return False
            self.sent.append(line)
            if line.split()[:1] == [STOP] and len(self.sent) > 1 and not self._ignore_stop:
                self.stopped = True
                self._cond.notify_all()
            return True

    def close_stdin(self) -> None:
        """Close stdin: later :meth:`send` calls return False. An agent that was sent
        nothing (a standby awaiting its configuration) exits with code 2 at once, as a
        real one does."""
        with self._cond:
            self.stdin_closed = True
            if not self.sent:
                self._exit_code, self._done = 2, True
                self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code once the output has ended, or None after ``timeout`` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, timeout):
                return None
            if self.killed:
                return KILLED_CODE
            return STOPPED_CODE if self.stopped else self._exit_code

    def kill(self) -> None:
        """End the output at once (a hanging agent yields nothing more)."""
        with self._cond:
            self.killed = True
            self._cond.notify_all()

    def stderr_tail(self) -> list[str]:
        """The scripted stderr lines."""
        return list(self._stderr)

    def alive_here(self) -> bool:
        """Never: a scripted agent stands for a remote host."""
        return False


class ScriptedTransport(Transport):
    """A :class:`~dmlctl.transport.base.Transport` whose agent and commands are scripted.

    Every :meth:`start` returns a new :class:`ScriptedProcess` replaying ``lines``
    (all of them are kept in :attr:`processes`; :attr:`process` is the last).
    :meth:`run` answers from ``results`` — argv tuple → ``(exit_code, stdout,
    stderr)`` — and answers an unscripted command with exit code 127; every call is
    kept in :attr:`runs`. ``start_error`` makes :meth:`start` raise it. With
    ``later``, the second and following starts replay those scripts instead.
    """

    def __init__(
        self,
        host: str,
        lines: Sequence[str] = (),
        exit_code: int = 0,
        hang: bool = False,
        *,
        ignore_stop: bool = False,
        stderr: Sequence[str] = (),
        results: Mapping[tuple[str, ...], tuple[int, str, str]] | None = None,
        start_error: Exception | None = None,
        later: Sequence[Sequence[str]] = (),
    ) -> None:
        self.host = host
        self.script = list(lines)
        #: Scripts for the 2nd, 3rd, … start (a restarted run); the last one repeats.
        self.later = [list(x) for x in later]
        self.exit_code = exit_code
        self.hang = hang
        self.ignore_stop = ignore_stop
        self.stderr = list(stderr)
        self.results = dict(results or {})
        self.start_error = start_error
        self.processes: list[ScriptedProcess] = []
        self.runs: list[dict[str, Any]] = []

    @property
    def process(self) -> ScriptedProcess:
        """The last process started (IndexError if none was)."""
        return self.processes[-1]

    def execute(self, command: Command) -> Outcome:
        """The scripted outcome of ``command`` (127 and a 'not scripted' stderr if none)."""
        self.runs.append(dataclasses.asdict(command))
        return self.results.get(command.argv, (127, "", f"not scripted: {list(command.argv)}"))

    def start(self, argv: Sequence[str], *, cwd: str | None = None) -> ScriptedProcess:
        """A new :class:`ScriptedProcess` (or ``start_error`` raised)."""
        if self.start_error is not None:
            raise self.start_error
        n = len(self.processes)
        later = self.later[min(n, len(self.later)) - 1] if n and self.later else None
        script = self.script if later is None else later
        proc = ScriptedProcess(
            self.host,
            script,
            exit_code=self.exit_code,
            hang=self.hang,
            ignore_stop=self.ignore_stop,
            stderr=self.stderr,
            argv=argv,
            cwd=cwd,
        )
        self.processes.append(proc)
        return proc


if TYPE_CHECKING:  # mypy proves the fakes satisfy the protocols they stand in for
    _transport: Transport = ScriptedTransport("host")
    _process: Process = ScriptedProcess("host", [])


# --------------------------------------------------------------- agent message lines


def _rank_line(kind: str, rank: int, ts: float, **fields: Any) -> str:
    # The agent forwards rank records verbatim; RankEventWriter writes kind first,
    # then the record's fields, then rank and ts.
    record = {"kind": kind, **fields, "rank": rank, "ts": ts}
    return wire.encode_rank_record(json.dumps(record, separators=(",", ":")))


def agent_started(pid: int = 4242, torchrun_pid: int = 4243) -> str:
    """The agent's first message: torchrun is running."""
    return wire.encode(wire.AgentMsg("started", pid=pid, torchrun_pid=torchrun_pid))


def agent_log(*lines: str) -> str:
    """Lines torchrun (or the agent itself) printed."""
    return wire.encode(wire.LogMsg(None, "agent", lines))


def rank_log(rank: int, *lines: str, stream: str = "stdout") -> str:
    """Lines rank ``rank`` wrote to ``stream`` (``stdout`` or ``stderr``)."""
    return wire.encode(wire.LogMsg(rank, stream, lines))


def rank_start(
    rank: int,
    local_rank: int | None = None,
    *,
    pid: int | None = None,
    role: str = "worker",
    host: str = "host",
    ts: float = DEFAULT_TS,
) -> str:
    """Rank ``rank``'s start record (``local_rank`` defaults to ``rank``)."""
    return _rank_line(
        protocol.KIND_START,
        rank,
        ts,
        local_rank=rank if local_rank is None else local_rank,
        pid=5000 + rank if pid is None else pid,
        role=role,
        host=host,
    )


def rank_metric(rank: int, step: int, values: Mapping[str, Any], *, ts: float = DEFAULT_TS) -> str:
    """One metric record of rank ``rank``."""
    return _rank_line(protocol.KIND_METRIC, rank, ts, step=step, values=dict(values))


def rank_exit(
    rank: int, code: int = 0, error: Mapping[str, Any] | None = None, *, ts: float = DEFAULT_TS
) -> str:
    """Rank ``rank``'s exit record; ``error`` is ``{type, message, traceback}`` or None."""
    return _rank_line(protocol.KIND_EXIT, rank, ts, code=code, error=dict(error) if error else None)


def rank_error(exc_type: str, message: str, traceback: Sequence[str] = ()) -> dict[str, Any]:
    """The ``error`` of an exit record, as the runtime entry writes it."""
    tb = list(traceback) or [
        "Traceback (most recent call last):",
        '  File "train.py", line 1, in <module>',
        f"{exc_type}: {message}",
    ]
    kind = named_kind(exc_type, message, 0).value  # what the names say ("Signal": killed)
    collateral = is_collateral(exc_type, message)
    return {
        "type": exc_type,
        "message": message,
        "traceback": tb,
        "kind": kind,
        "collateral": collateral,
    }


def agent_exit(code: int = 0, tail: Sequence[str] = (), *, stopped: bool = False) -> str:
    """The agent's last message: torchrun's exit code and its last lines."""
    return wire.encode(wire.ExitMsg(code, tuple(tail), stopped=stopped))


def agent_lines(
    ranks: Sequence[int],
    *,
    host: str = "host",
    logs: Mapping[int, Sequence[str]] | None = None,
    metrics: Mapping[int, Sequence[tuple[int, Mapping[str, Any]]]] | None = None,
    exits: Mapping[int, int | None] | None = None,
    errors: Mapping[int, Mapping[str, Any]] | None = None,
    agent_code: int | Literal["auto"] | None = "auto",
    tail: Sequence[str] = (),
    pid: int = 4242,
    ts: float = DEFAULT_TS,
) -> list[str]:
    """A whole agent session for the host running ``ranks`` (local ranks 0, 1, … in
    that order), in the order the real agent prints it:

    agent started, each rank's start record, each rank's log lines (``logs``) and
    metric records (``metrics``: ``(step, values)`` pairs), each rank's exit record
    (code from ``exits``, default 0, or 1 for a rank with an ``errors`` entry, which
    becomes the record's error; a rank mapped to None gets no exit record), and the
    agent's ``exit``
    message with ``agent_code`` (None: no exit message, as from a lost agent).
    ``"auto"`` is 0 if every rank exited 0 and 1 otherwise (what the agent reports).
    """
    logs = logs or {}
    metrics = metrics or {}
    exits = exits or {}
    errors = errors or {}
    out = [agent_started(pid)]
    out += [rank_start(r, i, host=host, ts=ts) for i, r in enumerate(ranks)]
    for r in ranks:
        if logs.get(r):
            out.append(rank_log(r, *logs[r]))
        out += [rank_metric(r, step, values, ts=ts) for step, values in metrics.get(r, ())]
    codes = {r: exits.get(r, 1 if r in errors else 0) for r in ranks}
    for r in ranks:
        code = codes[r]
        if code is not None:
            out.append(rank_exit(r, code, errors.get(r), ts=ts))
    if agent_code == "auto":
        agent_code = 1 if any(c not in (0, None) for c in codes.values()) else 0
    if agent_code is not None:
        out.append(agent_exit(agent_code, tail))
    return out
