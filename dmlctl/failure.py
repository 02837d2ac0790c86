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

import dataclasses
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
    ALLOCATION = "allocation ended"  # the batch scheduler's job ended: time limit, preemption…
    REQUEUED = "allocation requeued"  # it ended early, and a new one is asked for


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
    collateral: bool = field(default=False, kw_only=True)
    """A consequence of another failure (a collective that broke because a peer died,
    a checkpoint another rank refused): never the root cause while another is known.
    Its kind still says what failed (and so which budget it spends)."""
    recovered: bool = field(default=False, kw_only=True)
    """Recovered in place (``restart.mode: in_place``): the run went on without a new
    attempt (set by the reducer as it records the failure)."""

    def headline(self) -> str:
        """One line: ``rank 1 on host-a: ValueError: bad batch`` (``controller: …`` for
        the controller's own failures)."""
        if self.host == CONTROLLER and self.rank is None:
            return f"controller: {self.exc_type}: {self.message}"
        who = f"rank {self.rank}" if self.rank is not None else "host agent"
        return f"{who} on {self.host}: {self.exc_type}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (:func:`failure_from_dict` reads it back): every field by its
        name, the traceback a list and the two enums their values."""
        out = dataclasses.asdict(self)
        out.update(traceback=list(self.traceback), kind=self.kind.value)
        out.update(evidence=self.evidence.value)
        return out


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
    "LostAfterTraining": Kind.COLLATERAL,  # a replacement after the others finished
    "InPlaceLost": Kind.COLLATERAL,  # in-place recovery cannot go on: a full restart
}


def lost_after_training(rank: object, since: str = "") -> str:
    """Why a worker of an in-place run lost after its training (in what its script does
    after it) is not replaced and the run restarts as a whole; ``since``: what happened
    since, said after the loss (its own host's agent and a replacement elsewhere say
    the same)."""
    return (
        f"rank {rank} was lost after its training was over (in what the script does "
        f"after it: an evaluation, a save){since}; a replacement cannot rejoin a finished "
        "training, so the run restarts as a whole"
    )


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""The ``errno`` of a write that found no space (or no quota) left."""
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS"})
"""Signals a process raises against itself when it crashes: its own fault."""


def is_collateral(exc_type: str, message: str) -> bool:
    """Whether a rank's exception says something else caused it (:data:`COLLATERAL_MARKERS`)."""
    return any(marker in f"{exc_type}: {message}" for marker in COLLATERAL_MARKERS)


def error_kind(exc_type: str, message: str) -> Kind:
    """The kind of a rank's exception from its type's name and message (what a rank's
    exit record carries: :func:`exception_kind` on the rank calls this): its type's
    kind (a corrupt checkpoint is one whatever its text says), else collateral by its
    text, else the user's code."""
    known = _RANK_TYPES.get(exc_type.rpartition(".")[2])
    if known is not None:
        return known
    return Kind.COLLATERAL if is_collateral(exc_type, message) else Kind.USER


def exception_kind(exc: BaseException) -> Kind:
    """The kind of ``exc``, raised in a rank (a full disk whatever raised it)."""
    if isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS:
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


PORT_TAKEN = "RendezvousPortTaken"
"""A host agent's failure: its torchrun could not listen on the rendezvous port
(another process took it after the plan found it free); the next attempt meets at
another port."""

_NAMED = {
    "Hang": Kind.HANG,
    "AgentLost": Kind.AGENT_LOST,
    "AgentExit": Kind.AGENT,
    PORT_TAKEN: Kind.AGENT,
    "HostsLost": Kind.HOSTS_LOST,
    "SpecInvalid": Kind.SPEC,
    "RunDirGone": Kind.RECORDS,
    "StoreError": Kind.RECORDS,
    "ControllerLost": Kind.CONTROLLER,
    "AllocationEnded": Kind.ALLOCATION,
    "AllocationRequeued": Kind.REQUEUED,
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


_EXIT_NAMES = ("Signal", "ExitCode", PORT_TAKEN)
_SEEN_NAMES = (
    "Hang",
    "AgentLost",
    "HostsLost",
    "ControllerLost",
    "RunDirGone",
    "StoreError",
    "AllocationEnded",
    "AllocationRequeued",
)


def named_evidence(host: str, exc_type: str, message: str) -> Evidence:
    """What an older record's failure was known from, by its names (its producer)."""
    generic = exc_type == "AgentExit" and message.startswith("torchrun exited with code")
    if exc_type in _EXIT_NAMES or generic:
        return Evidence.EXIT
    if exc_type in _SEEN_NAMES or host == CONTROLLER:
        return Evidence.SEEN
    return Evidence.RECORD


def named(
    host: str,
    rank: int | None,
    exc_type: str,
    message: str,
    traceback: tuple[str, ...] = (),
    ts: float = 0.0,
    *,
    evidence: Evidence | None = None,
) -> Failure:
    """A failure whose kind, evidence and collateral flag its names and text say
    (:func:`named_kind`, :func:`named_evidence`): an older record's."""
    return Failure(
        host,
        rank,
        exc_type,
        message,
        traceback,
        ts,
        kind=named_kind(exc_type, message, rank),
        evidence=evidence or named_evidence(host, exc_type, message),
        collateral=is_collateral(exc_type, message),
    )


def failure_from_dict(data: Mapping[str, Any]) -> Failure:
    """Inverse of :meth:`Failure.to_dict`; one without a kind (an older dmlctl's) gets
    the kind its names say (:func:`named`)."""
    exc_type, message = str(data["exc_type"]), str(data["message"])
    rank = None if data.get("rank") is None else int(data["rank"])
    traceback = tuple(str(x) for x in data.get("traceback", ()))
    old = named(str(data["host"]), rank, exc_type, message, traceback, float(data.get("ts", 0.0)))
    if not data.get("kind"):
        return old
    return dataclasses.replace(
        old,
        kind=Kind(data["kind"]),
        evidence=Evidence(data["evidence"]),
        collateral=bool(data.get("collateral", False)),
        recovered=bool(data.get("recovered", False)),
    )


def pick_root_cause(failures: Iterable[Failure]) -> Failure | None:
    """The failure among ``failures`` (in arrival order) that explains the others — the
    one rule set, the same whatever order they arrived in:

    0. the end of the run's allocation (a batch scheduler's time limit, preemption,
       cancel) explains every death in it, and so does the loss of the run's records
       (its directory deleted, a full disk: the ranks' saves into it fail too);
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
    told = [
        (host, rank)
        for host, rank, ev in ((f.host, f.rank, f.evidence) for f in seen)
        if ev is not Evidence.EXIT
    ]
    ranks, hosts = set(told), {host for host, _ in told}
    agents = {host for host, rank in told if rank is None}

    def superseded(f: Failure) -> bool:
        if f.evidence is not Evidence.EXIT:
            return False
        about_host = f.rank is None and f.host in hosts
        return (f.host, f.rank) in ranks or about_host or f.host in agents

    return min((f for f in seen if not superseded(f)), key=_order, default=None)


def explains_better(new: Failure, old: Failure | None) -> bool:
    """Whether ``new`` would replace ``old`` as the root cause (:func:`pick_root_cause`)."""
    return old is None or pick_root_cause([old, new]) is new


#: Ends that explain the ranks' deaths in them: the allocation's end (a requeue that
#: failed says more), the run's records lost (its directory deleted, a full disk: the
#: ranks' saves into it fail too).
_ENDS = {Kind.ALLOCATION: 0, Kind.REQUEUED: 1, Kind.RECORDS: 1}


def _order(f: Failure) -> tuple[int, bool, bool, float]:
    return _ENDS.get(f.kind, 2), f.collateral, f.evidence is Evidence.EXIT, f.ts
