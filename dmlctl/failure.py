"""What a failure is, and which of several failures ended a run: one type, one judge.

A :class:`Failure` is made by the producer that knows it — a rank's own exception
record (:func:`exception_kind`, on the rank), torchrun's exit status of a rank that
left no record (:func:`exit_kind`), the host agent, the controller (a hang, a lost
agent, its own records) — with its :class:`Kind` and the :class:`Evidence` behind it.
Everything after reads the kind: the restart policy (``dmlctl.launch.policy``), the
root-cause panel, ``status`` and ``--json``. Which of an attempt's failures is its root
cause is decided by :func:`pick_root_cause` alone.

Torch-free and I/O-free: the rank runtime, the agent and the controller all import it.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dmlctl.protocol import DELETED_WHILE_RUNNING


class Kind(str, Enum):
    """What failed, as far as the producer of a failure could tell."""

    USER = "user code"  # the rank's own exception, or a non-zero exit it chose
    CRASH = "crash signal"  # the process crashed itself (SIGSEGV, SIGABRT, …)
    KILLED = "killed from outside"  # SIGKILL, SIGTERM, SIGHUP …: kill, OOM killer, preemption
    OOM = "out of memory"  # MemoryError, torch's OutOfMemoryError
    DISK_FULL = "disk full"
    HANG = "hang"
    COLLATERAL = "collateral"  # a consequence: a peer or the network died, the run dir went
    CHECKPOINT = "checkpoint"  # no checkpoint can be loaded, or it is another run's
    AGENT = "agent"  # the host agent or torchrun failed, or could not be started
    AGENT_LOST = "agent lost"  # the agent's output ended without its exit message
    HOSTS_LOST = "hosts lost"  # too few hosts answer for the next attempt
    SPEC = "spec"  # the run's own argv, env or directory cannot be started
    RECORDS = "records"  # the run's directory was deleted, or its records cannot be kept
    CONTROLLER = "controller"  # the controller died (a resumed run)


class Evidence(str, Enum):
    """What a failure is known from."""

    RECORD = "record"  # the failing process's own report (a rank's exception, the agent's)
    SEEN = "seen"  # the controller's observation (a hang, a lost agent, its own store)
    EXIT = "exit"  # an exit status alone (torchrun's summary, a rank without a record)


@dataclass(frozen=True)
class Failure:
    """Why a rank (or a host, or the controller) failed: the first thing to read."""

    host: str
    rank: int | None
    exc_type: str  # the name shown: an exception's type, ``Signal``, ``Hang`` …
    message: str
    traceback: tuple[str, ...] = ()
    ts: float = 0.0  # when it was recorded (wall clock of its producer)
    kind: Kind = field(kw_only=True)
    evidence: Evidence = field(kw_only=True)

    @property
    def collateral(self) -> bool:
        """A consequence of another failure, never a root cause while one is known."""
        return self.kind is Kind.COLLATERAL

    def headline(self) -> str:
        """One line: ``rank 1 on host-a: ValueError: bad batch`` (``controller: …`` for
        the controller's own failures)."""
        if self.host == CONTROLLER and self.rank is None:
            return f"controller: {self.exc_type}: {self.message}"
        who = f"rank {self.rank}" if self.rank is not None else "host agent"
        return f"{who} on {self.host}: {self.exc_type}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (:func:`failure_from_dict` reads it back)."""
        return {
            "host": self.host,
            "rank": self.rank,
            "exc_type": self.exc_type,
            "message": self.message,
            "traceback": list(self.traceback),
            "ts": self.ts,
            "kind": self.kind.value,
            "evidence": self.evidence.value,
        }


CONTROLLER = "controller"
"""The host name of the controller's own failures (a full disk, a lost controller)."""

COLLATERAL_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "DistNetworkError",
    "DistBackendError",
    "Socket Timeout",
    "Timed out waiting",
    "collective operation timeout",
    "NCCL communicator was aborted",
    "another rank refused",  # dmlctl's checkpoint loader: that rank names the file
    DELETED_WHILE_RUNNING,  # a checkpoint directory gone with the run directory
)
"""What a rank's error says when something else caused it (a collective whose
connection closed or timed out when a peer died): gloo's errors are RuntimeErrors
that only their text tells apart."""

_RANK_TYPES = {
    "DiskFull": Kind.DISK_FULL,
    "CheckpointCorrupt": Kind.CHECKPOINT,
    "CheckpointForeign": Kind.CHECKPOINT,
    "MemoryError": Kind.OOM,
    "OutOfMemoryError": Kind.OOM,  # torch.OutOfMemoryError (CUDA)
}
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS"})
"""Signals a process raises against itself when it crashes: its own fault."""


def error_kind(exc_type: str, message: str) -> Kind:
    """The kind of a rank's exception from its type's name and message (what a rank's
    exit record carries: :func:`exception_kind` on the rank calls this)."""
    if any(marker in f"{exc_type}: {message}" for marker in COLLATERAL_MARKERS):
        return Kind.COLLATERAL
    return _RANK_TYPES.get(exc_type.rpartition(".")[2], Kind.USER)


def exception_kind(exc: BaseException) -> Kind:
    """The kind of ``exc``, raised in a rank (a full disk whatever raised it)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return Kind.DISK_FULL
    if isinstance(exc, MemoryError):
        return Kind.OOM
    return error_kind(type(exc).__qualname__, str(exc))


def exit_kind(code: int) -> Kind:
    """The kind of a process's exit status alone: a crash signal, another signal (from
    outside), or a code the process chose."""
    if code >= 0:
        return Kind.USER
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return Kind.KILLED
    return Kind.CRASH if name in CRASH_SIGNALS else Kind.KILLED


_NAMED = {
    "Hang": Kind.HANG,
    "AgentLost": Kind.AGENT_LOST,
    "AgentExit": Kind.AGENT,
    "HostsLost": Kind.HOSTS_LOST,
    "SpecInvalid": Kind.SPEC,
    "RunDirGone": Kind.RECORDS,
    "StoreError": Kind.RECORDS,
    "ControllerLost": Kind.CONTROLLER,
}


def named_kind(exc_type: str, message: str, rank: int | None) -> Kind:
    """The kind a failure recorded without one (a ``state.json`` of an older dmlctl)
    had, from its names: the only place that reads a kind from names after the fact."""
    if exc_type in _NAMED:
        return _NAMED[exc_type]
    if exc_type == "Signal":
        crash = any(sig in message for sig in CRASH_SIGNALS)
        return Kind.CRASH if crash else Kind.KILLED
    if rank is None and exc_type not in _RANK_TYPES:
        return Kind.AGENT
    return error_kind(exc_type, message)


def named(
    host: str,
    rank: int | None,
    exc_type: str,
    message: str,
    traceback: tuple[str, ...] = (),
    ts: float = 0.0,
    *,
    evidence: Evidence = Evidence.RECORD,
) -> Failure:
    """A failure whose kind its names say (:func:`named_kind`): an older record's."""
    kind = named_kind(exc_type, message, rank)
    return Failure(host, rank, exc_type, message, traceback, ts, kind=kind, evidence=evidence)


def failure_from_dict(data: Mapping[str, Any]) -> Failure:
    """Inverse of :meth:`Failure.to_dict`; one without a kind (an older dmlctl's) gets
    the kind its names say (:func:`named`)."""
    exc_type, message = str(data["exc_type"]), str(data["message"])
    rank = None if data.get("rank") is None else int(data["rank"])
    evidence = Evidence(data.get("evidence", Evidence.RECORD.value))
    traceback = tuple(str(x) for x in data.get("traceback", ()))
    ts, host = float(data.get("ts", 0.0)), str(data["host"])
    if not data.get("kind"):
        return named(host, rank, exc_type, message, traceback, ts, evidence=evidence)
    kind = Kind(data["kind"])
    return Failure(host, rank, exc_type, message, traceback, ts, kind=kind, evidence=evidence)


def pick_root_cause(failures: Iterable[Failure]) -> Failure | None:
    """The failure among ``failures`` (in arrival order) that explains the others — the
    one rule set, the same whatever order they arrived in:

    1. an exit status alone is dropped when a record or an observation is about the
       same rank (a host agent's failure is about each of its host's ranks): torchrun's
       summary names the rank whose record already explained it, and "torchrun exited
       with code 1" says less than the rank's error;
    2. a root failure beats a collateral one (a collective that broke because a peer
       died), whatever arrived first;
    3. a failure known from a record or an observation beats an exit status alone (a
       rank's exit code when its records were lost with the run's directory);
    4. then the earlier one; of equals, the one that arrived first.
    """
    seen = list(failures)
    told = [f for f in seen if not any(_supersedes(g, f) for g in seen)]
    return min(told, key=_order, default=None)


def explains_better(new: Failure, old: Failure | None) -> bool:
    """Whether ``new`` would replace ``old`` as the root cause (:func:`pick_root_cause`)."""
    return old is None or pick_root_cause([old, new]) is new


def _supersedes(g: Failure, f: Failure) -> bool:
    """``g`` says more than ``f`` about the same rank (or its host agent)."""
    same = g.host == f.host and (g.rank == f.rank or g.rank is None or f.rank is None)
    return same and f.evidence is Evidence.EXIT and g.evidence is not Evidence.EXIT


def _order(f: Failure) -> tuple[bool, bool, float]:
    return f.collateral, f.evidence is Evidence.EXIT, f.ts
