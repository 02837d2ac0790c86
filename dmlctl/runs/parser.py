"""Agent output → typed events. Pure: one line in, a list of events out.

Anything that is not a well-formed agent message becomes an agent log line, so a
stray print on a host is shown, never lost and never fatal.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from dmlctl import protocol, torchrun_report, wire
from dmlctl.failure import (
    PORT_TAKEN,
    Evidence,
    Failure,
    Kind,
    error_kind,
    exit_kind,
    is_collateral,
    named_kind,
)
from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    CheckpointSaved,
    Collective,
    Event,
    Heartbeat,
    LogLines,
    MetricRecord,
    Prepared,
    ProcSample,
    ProcUsage,
    RankExited,
    RankRespawned,
    RankStarted,
    StackDump,
    StacksDumped,
    Stream,
)

_STREAMS = {s.value: s for s in Stream}
_TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def torchrun_failure(
    host: str, tail: Sequence[str], ts: float = 0.0, summary: Sequence[str] | None = None
) -> Failure | None:
    """The failed rank torchrun's failure summary names (``rank : N`` / ``exitcode : X``
    lines), for ranks that died without a Python exception: a rank killed by a signal
    other than SIGTERM first (it could not report itself; torchrun's own "Root Cause"
    only picks the earliest failure, in whole seconds, so a peer that died of the broken
    connection in the same second may stand there), else the one after "Root Cause",
    else one killed by SIGTERM, else the first.
    ``summary`` — the summary's lines from all of torchrun's output, which other ranks'
    tracebacks can push out of ``tail`` — is read instead of ``tail`` when given."""
    lines = list(summary) if summary else list(tail)
    start = next((i for i, s in enumerate(lines) if s.startswith("Root Cause")), len(lines))
    failures: list[tuple[bool, int, int]] = []  # (is the root cause entry, rank, code)
    rank: int | None = None
    for i, line in enumerate(lines):
        if (m := _TORCHRUN_RANK.match(line)) is not None:
            rank = int(m.group(1))
        elif rank is not None and (m := _TORCHRUN_EXIT.match(line)) is not None:
            failures.append((i > start, rank, int(m.group(1))))
            rank = None
    if not failures:
        return None
    # SIGTERM is how torchrun itself stops the other workers once one failed: weaker
    # evidence than the first observed failure (a rank still writing its own error
    # when the SIGTERM came would otherwise take the blame).
    killed = [f for f in failures if f[2] < 0 and f[2] != -signal.SIGTERM]
    signalled = [f for f in failures if f[2] < 0]
    rooted = [f for f in failures if f[0]]
    _, rank, code = (killed or rooted or signalled or failures)[0]
    return _exit_failure(host, rank, code, tail, ts)


def recorded_failure(
    host: str, failures: Sequence[wire.RankFailure], tail: Sequence[str], ts: float = 0.0
) -> Failure | None:
    """The failed rank torchrun's own record names (:mod:`dmlctl.agent.torchrun`), by
    the rules :func:`torchrun_failure` applies to its printed report: a rank killed
    by a signal other than SIGTERM first, else the first to end by itself, else one
    killed by SIGTERM (how torchrun stops the others once one failed). Its lines say
    how every failed rank ended; torchrun's printed report stays in the agent's log."""
    killed = [f for f in failures if f.exitcode < 0 and f.exitcode != -signal.SIGTERM]
    ended = sorted((f for f in failures if f.exitcode > 0), key=lambda f: f.ts)
    signalled = [f for f in failures if f.exitcode < 0]
    ranked = killed or ended or signalled
    if not ranked:
        return None
    said = [f"rank {f.rank} (pid {f.pid}) {_describe_exit(f.exitcode)}" for f in failures]
    said.append(f"torchrun's report: logs/agent-{host}.log")
    return _exit_failure(host, ranked[0].rank, ranked[0].exitcode, said, ts)


def _exit_failure(host: str, rank: int, code: int, tail: Sequence[str], ts: float) -> Failure:
    """A rank's failure known by its exit status alone."""
    name, kind = "Signal" if code < 0 else "ExitCode", exit_kind(code)
    return Failure(
        host,
        rank,
        name,
        _describe_exit(code),
        tuple(tail[-15:]),
        ts,
        kind=kind,
        evidence=Evidence.EXIT,
    )


def _cause(host: str, rank: int, error: Any, ts: float) -> Failure | None:
    """The failure a rank's exit record states (``error``: ``{type, message,
    traceback, kind, collateral}``; anything else is kept as its message)."""
    if not error:
        return None
    if not isinstance(error, Mapping):
        error = {"type": "Error", "message": str(error)}
    exc_type, message = str(error.get("type", "Error")), str(error.get("message", ""))
    collateral = error.get("collateral")
    return Failure(
        host=host,
        rank=rank,
        exc_type=exc_type,
        message=message,
        traceback=tuple(str(x) for x in error.get("traceback", ())),
        ts=ts,
        kind=_kind(error.get("kind")) or error_kind(exc_type, message),
        evidence=Evidence.RECORD,
        collateral=collateral if isinstance(collateral, bool) else is_collateral(exc_type, message),
    )


def _kind(value: Any) -> Kind | None:
    """The kind a record carries (None: none, or one this dmlctl does not know)."""
    try:
        return Kind(value) if value is not None else None
    except ValueError:
        return None


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _coll(rows: Mapping[str, Any] | None) -> dict[str, Collective]:
    """``{group: [entered, completed, op, age, size]}`` rows as typed values."""
    out: dict[str, Collective] = {}
    if not isinstance(rows, Mapping):
        return out
    for group, row in rows.items():
        size = int(row[4]) if len(row) > 4 else 0
        out[str(group)] = Collective(
            int(row[0]), int(row[1]), _opt_str(row[2]), _opt_float(row[3]), size
        )
    return out


def _heartbeat(host: str, rank: int, rec: Mapping[str, Any], ts: float) -> Heartbeat:
    coll = _coll(rec.get("coll"))
    return Heartbeat(
        host,
        rank,
        int(rec["progress"]),
        ts,
        armed=bool(rec.get("armed", False)),
        since=_opt_float(rec.get("since")),
        phase=_opt_str(rec.get("phase")),
        phase_s=_opt_float(rec.get("phase_s")),
        limit=_opt_float(rec.get("limit")),
        step_s=_opt_float(rec.get("step_s")),
        where=_opt_str(rec.get("where")),
        inner=_opt_str(rec.get("inner")),
        stage=_opt_str(rec.get("stage")),
        coll=coll,
    )


def _respawn_cause(host: str, rank: int, code: int, ts: float) -> Failure:
    """Why a rank was started again in place: its process ended with ``code``."""
    name = signal.Signals(-code).name if code < 0 else f"code {code}"
    message = f"killed by {name}; started again in place" if code < 0 else f"exited with {name}"
    return Failure(
        host, rank, "Signal", message, (), ts, kind=exit_kind(code), evidence=Evidence.EXIT
    )


def _rank_record(host: str, rec: Mapping[str, Any]) -> list[Event]:
    kind, rank, ts = rec["kind"], int(rec["rank"]), float(rec["ts"])
    if kind == protocol.KIND_METRIC:
        return [MetricRecord(host, rank, int(rec["step"]), dict(rec["values"]), ts)]
    if kind == protocol.KIND_START:
        return [
            RankStarted(
                host,
                rank,
                int(rec["local_rank"]),
                str(rec["role"]),
                int(rec["pid"]),
                ts,
                _opt_str(rec.get("store")),
            )
        ]
    if kind == protocol.KIND_HEARTBEAT:
        return [_heartbeat(host, rank, rec, ts)]
    if kind == protocol.KIND_PREPARED:
        return [Prepared(host, rank, str(rec["strategy"]), ts)]
    if kind == protocol.KIND_CHECKPOINT:
        return [CheckpointSaved(host, rank, int(rec["step"]), str(rec["dir"]), ts)]
    if kind == protocol.KIND_RESPAWN:
        return [
            RankRespawned(
                host, rank, _respawn_cause(host, rank, int(rec["code"]), ts), int(rec["pid"]), ts
            )
        ]
    if kind == protocol.KIND_EXIT:
        cause = _cause(host, rank, rec.get("error"), ts)
        return [RankExited(host, rank, int(rec["code"]), cause, ts, _coll(rec.get("coll")))]
    raise ValueError(f"unknown rank record kind {kind!r}")


def parse_line(host: str, line: str, now: float) -> list[Event]:
    """Events carried by one line of host ``host``'s agent output; a line that is no
    message of this wire (:func:`dmlctl.wire.decode`) is the agent's output, kept with
    the reason when it looked like a message."""
    try:
        msg = wire.decode(line)
        return _events(host, msg, now)
    except wire.WireError as e:
        if e.claimed:
            line = f"dmlctl: not understood ({e}): {line}"
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:  # a bad record
        line = f"dmlctl: not understood ({type(e).__name__}: {e}): {line}"
    return [LogLines(host, None, Stream.AGENT, (line,), now)]


def _events(host: str, msg: wire.Message, now: float) -> list[Event]:
    """The events one decoded message carries."""
    if isinstance(msg, wire.LogMsg):
        return [LogLines(host, msg.rank, _STREAMS[msg.stream], msg.lines, now)]
    if isinstance(msg, wire.RankMsg):
        return _rank_record(host, msg.record)
    if isinstance(msg, wire.StacksMsg):
        return [StackDump(host, msg.rank, msg.lines, now, msg.where, msg.inner)]
    if isinstance(msg, wire.AgentMsg):
        if msg.state == "alive":  # the keepalive, with the ranks' processes as /proc shows
            procs = {r: ProcUsage(*u) for r, u in msg.procs.items()}
            return [ProcSample(host, procs, now)] if procs else []
        if msg.state == "dumped":
            return [StacksDumped(host, msg.stopped, now)]
        return [AgentStarted(host, int(msg.pid or 0), now)]
    return [AgentExited(host, msg.code, msg.tail, now, _exit_cause(host, msg, now))]


def _port_taken(host: str, msg: wire.ExitMsg, now: float) -> Failure | None:
    """The agent's failure when its torchrun could not listen on the rendezvous port
    (another process had taken it), else None."""
    port = next((p for s in msg.summary if (p := torchrun_report.port_taken(s)) is not None), None)
    if port is None:
        return None
    text = f"the rendezvous port {port} was taken by another process before torchrun bound it"
    return Failure(
        host, None, PORT_TAKEN, text, msg.tail, now, kind=Kind.AGENT, evidence=Evidence.EXIT
    )


def _exit_cause(host: str, msg: wire.ExitMsg, now: float) -> Failure | None:
    """Why the agent's run failed: its own error (it could not start the run at all),
    else the failed rank of torchrun's own record, else of its printed report (a
    torchrun that could not write its record)."""
    error = msg.error
    if error is None:
        if msg.code == 0:
            return None
        if not msg.failures and (taken := _port_taken(host, msg, now)) is not None:
            return taken  # no rank ran: the rendezvous never met
        if msg.failures:
            return recorded_failure(host, msg.failures, msg.tail, now)
        return torchrun_failure(host, msg.tail, now, msg.summary)
    name, message = str(error.get("type", "AgentExit")), str(error.get("message", ""))
    kind = _kind(error.get("kind")) or named_kind(name, message, None)
    return Failure(host, None, name, message, msg.tail, now, kind=kind, evidence=Evidence.RECORD)
