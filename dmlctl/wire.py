"""Host agent → controller messages: one type each, one :func:`encode`, one :func:`decode`.

The agent prints one message per line on its stdout; the controller's parser
(``dmlctl.runs.parser``) decodes each and turns it into events. Every message carries
its kind (``k``) and the wire's version (``v``): a line that is no message, a kind this
dmlctl does not know or another version is refused by :func:`decode` with a
:class:`WireError` that says which (the parser shows such a line as the agent's
output, with the reason: never lost, never fatal). A rank's record travels as the rank
wrote it (:func:`encode_rank_record` splices it in without decoding it).

Torch-free, standard library only: the agent, the fakes and the controller share it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
"""The wire's version; an agent of another version is refused by name."""

LOG, RANK, STACKS, AGENT, EXIT = "log", "rank", "stacks", "agent", "exit"


class WireError(ValueError):
    """A line that is not a message of this wire (the reason is the text);
    ``claimed``: it had a message's form (a JSON object with a kind), so the reason
    is worth showing beside it."""

    def __init__(self, reason: str, *, claimed: bool = True) -> None:
        super().__init__(reason)
        self.claimed = claimed


@dataclass(frozen=True)
class LogMsg:
    """Lines of one stream: a rank's (``rank`` set) or the agent's and torchrun's own
    (``rank`` None; ``stream`` ``agent`` or ``torchrun``)."""

    rank: int | None
    stream: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class RankMsg:
    """One record a rank wrote (``dmlctl.protocol.RankEventWriter``), as written."""

    record: Mapping[str, Any]


@dataclass(frozen=True)
class StacksMsg:
    """A rank's stack dump, with its main thread's position (``where``/``inner``)."""

    rank: int
    lines: tuple[str, ...]
    where: str | None = None
    inner: str | None = None


@dataclass(frozen=True)
class AgentMsg:
    """The agent's own state: ``started`` (its pid, torchrun's), ``alive`` (once a
    second, with each rank's ``[state, CPU s, I/O bytes]``), ``dumped`` (stacks taken;
    the ranks it found stopped)."""

    state: str
    pid: int | None = None
    torchrun_pid: int | None = None
    procs: Mapping[int, tuple[str, float, int]] = field(default_factory=dict)
    stopped: tuple[int, ...] = ()


@dataclass(frozen=True)
class RankFailure:
    """A failed rank as torchrun recorded it: its global rank, exit code (negative:
    killed by that signal), pid, and when (whole seconds; from the rank's error file
    when it wrote one)."""

    rank: int
    exitcode: int
    pid: int
    ts: float


def encode_failures(failures: Sequence[RankFailure]) -> str:
    """The failed ranks as one JSON document (the file torchrun's wrapper writes)."""
    return json.dumps([dataclasses.asdict(f) for f in failures])


def decode_failures(raw: object) -> tuple[RankFailure, ...]:
    """Failed ranks from :func:`encode_failures`'s document (parsed) or an exit
    message's list; :class:`WireError` when they are not that shape."""
    if not isinstance(raw, list):
        raise WireError("failed ranks: not a list")
    try:
        return tuple(
            RankFailure(int(f["rank"]), int(f["exitcode"]), int(f["pid"]), float(f["ts"]))
            for f in raw
        )
    except (KeyError, TypeError, ValueError) as e:
        raise WireError(f"failed ranks: {e!r}") from None


@dataclass(frozen=True)
class ExitMsg:
    """The agent's last message: torchrun's exit code, its last lines and failure
    summary, whether the controller stopped it, the error of an agent that could
    not start its run at all (``{type, message, kind}``), and torchrun's own record
    of the ranks that failed (empty when it wrote none)."""

    code: int
    tail: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()
    stopped: bool = False
    error: Mapping[str, Any] | None = None
    failures: tuple[RankFailure, ...] = ()


Message = LogMsg | RankMsg | StacksMsg | AgentMsg | ExitMsg


def _fields(msg: Message) -> dict[str, Any]:
    if isinstance(msg, LogMsg):
        return {"k": LOG, "r": msg.rank, "s": msg.stream, "l": list(msg.lines)}
    if isinstance(msg, RankMsg):
        return {"k": RANK, "rec": dict(msg.record)}
    if isinstance(msg, StacksMsg):
        return {
            "k": STACKS,
            "r": msg.rank,
            "l": list(msg.lines),
            "where": msg.where,
            "inner": msg.inner,
        }
    if isinstance(msg, AgentMsg):
        procs = {str(r): list(u) for r, u in msg.procs.items()}
        out = {"k": AGENT, "state": msg.state, "pid": msg.pid, "torchrun_pid": msg.torchrun_pid}
        return {**out, "procs": procs, "stopped": list(msg.stopped)}
    return {
        "k": EXIT,
        "code": msg.code,
        "tail": list(msg.tail),
        "summary": list(msg.summary),
        "stopped": msg.stopped,
        "error": dict(msg.error) if msg.error is not None else None,
        "failures": [dataclasses.asdict(f) for f in msg.failures],
    }


def encode(msg: Message) -> str:
    """``msg`` as one JSON line (without the newline)."""
    return json.dumps({**_fields(msg), "v": VERSION}, separators=(",", ":"))


def encode_rank_record(record_json: str) -> str:
    """A rank's record (one JSON object, as the rank wrote it) as a :class:`RankMsg`
    line, without decoding it: the agent's hot path."""
    return f'{{"k":"{RANK}","v":{VERSION},"rec":{record_json}}}'


def decode(line: str) -> Message:
    """The message ``line`` carries. Raises :class:`WireError` saying why for a line
    that is no JSON object, has another version, an unknown kind or a bad field."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        raise WireError("not JSON", claimed=False) from None
    if not isinstance(data, dict) or "k" not in data:
        raise WireError("not an agent message", claimed=False)
    if data.get("v") != VERSION:
        raise WireError(
            f"an agent of another dmlctl (wire version {data.get('v')!r}, not {VERSION})"
        )
    kind = data["k"]
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise WireError(f"unknown message kind {kind!r}")
    try:
        return decoder(data)
    except KeyError as e:
        raise WireError(f"{kind} message without {e}") from None
    except (TypeError, ValueError, IndexError, AttributeError) as e:
        raise WireError(f"bad {kind} message: {e}") from None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _log(d: Mapping[str, Any]) -> LogMsg:
    rank = None if d["r"] is None else int(d["r"])
    return LogMsg(rank, str(d["s"]), tuple(str(x) for x in d["l"]))


def _rank(d: Mapping[str, Any]) -> RankMsg:
    if not isinstance(d["rec"], dict):
        raise TypeError("its record is not an object")
    return RankMsg(d["rec"])


def _stacks(d: Mapping[str, Any]) -> StacksMsg:
    lines = tuple(str(x) for x in d["l"])
    return StacksMsg(int(d["r"]), lines, _opt_str(d.get("where")), _opt_str(d.get("inner")))


AGENT_STATES = ("started", "alive", "dumped")


def _agent(d: Mapping[str, Any]) -> AgentMsg:
    if d["state"] not in AGENT_STATES:
        raise ValueError(f"unknown agent state {d['state']!r}")
    if d["state"] == "started" and d.get("pid") is None:
        raise ValueError("a started agent without its pid")
    raw = d.get("procs") or {}
    if not isinstance(raw, Mapping):
        raise TypeError("procs is not an object")
    procs = {int(r): (str(u[0]), float(u[1]), int(u[2])) for r, u in raw.items()}
    pid, torchrun_pid = d.get("pid"), d.get("torchrun_pid")
    return AgentMsg(
        str(d["state"]),
        None if pid is None else int(pid),
        None if torchrun_pid is None else int(torchrun_pid),
        procs,
        tuple(int(r) for r in d.get("stopped") or ()),
    )


def _exit(d: Mapping[str, Any]) -> ExitMsg:
    error = d.get("error")
    return ExitMsg(
        int(d["code"]),
        tuple(str(x) for x in d.get("tail") or ()),
        tuple(str(x) for x in d.get("summary") or ()),
        bool(d.get("stopped", False)),
        error if isinstance(error, dict) else None,
        decode_failures(d.get("failures") or []),
    )


_DECODERS: dict[str, Callable[[Mapping[str, Any]], Message]] = {
    LOG: _log,
    RANK: _rank,
    STACKS: _stacks,
    AGENT: _agent,
    EXIT: _exit,
}
