"""Typed events: everything that comes back from the hosts, and the controller's own steps.

A failure an event carries is a :class:`dmlctl.failure.Failure`.

Events are immutable values. The supervisor reduces them into a
:class:`dmlctl.runs.state.RunState` with :func:`dmlctl.runs.reducer.apply`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from dmlctl.failure import Failure


class Stream(str, Enum):
    """Where a log line came from."""

    STDOUT = "stdout"
    STDERR = "stderr"
    AGENT = "agent"  # the host agent or torchrun itself, not a rank
    #: torchrun's own report of a failed worker (its log lines, its traceback and
    #: "Root Cause" block): kept in the run's logs, not shown, since dmlctl's root
    #: cause says the same from the rank's own record.
    TORCHRUN = "torchrun"


@dataclass(frozen=True)
class LogLines:
    """Consecutive lines of one stream of one rank (``rank`` None: the host agent or
    torchrun), in order, as one agent message carried them."""

    host: str
    rank: int | None
    stream: Stream
    lines: tuple[str, ...]
    ts: float


@dataclass(frozen=True)
class MetricRecord:
    """One ``ctx.log`` call of a rank. ``values`` may carry a strategy's cumulative
    :data:`dmlctl.protocol.COMM_TOTALS` besides its window values (absent in records
    of an older dmlctl); the reducer keeps those in ``RankState.comm``."""

    host: str
    rank: int
    step: int
    values: Mapping[str, float | int | str | bool | None]
    ts: float


@dataclass(frozen=True)
class RankStarted:
    host: str
    rank: int
    local_rank: int
    role: str
    pid: int
    ts: float
    store: str | None = None  # the run's store (address:port), as torchrun gave it


@dataclass(frozen=True)
class RankRespawned:
    """A rank's process died (``cause``) and was started again in place while the
    others went on (``restart.mode: in_place``); ``pid`` is the new process."""

    host: str
    rank: int
    cause: Failure
    pid: int
    ts: float


@dataclass(frozen=True)
class HostReplaced:
    """Host ``host`` was lost (``cause``) and its ``ranks`` were started on host ``to``
    into the running world while the others went on (``restart.mode: in_place``)."""

    host: str
    to: str
    ranks: tuple[int, ...]
    cause: Failure
    ts: float


@dataclass(frozen=True)
class HostDropped:
    """Host ``host`` was lost (``cause``), no host could take its ``ranks``, and the
    others go on without them (``restart.mode: in_place``, ``restart.rejoin_wait``)."""

    host: str
    ranks: tuple[int, ...]
    cause: Failure
    ts: float


@dataclass(frozen=True)
class Collective:
    """A rank's collectives in one process group: the sequence numbers of the last one
    it entered and the last it completed; the oldest pending one's op name and age in
    seconds (when it was reported), or None; the group's size (0: not known)."""

    entered: int
    completed: int
    op: str | None = None
    age: float | None = None
    size: int = 0


@dataclass(frozen=True)
class RankExited:
    """A rank ended; ``coll`` holds its final collective counts when it reported them."""

    host: str
    rank: int
    exit_code: int
    cause: Failure | None
    ts: float
    coll: Mapping[str, Collective] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentStarted:
    host: str
    pid: int
    ts: float


@dataclass(frozen=True)
class AgentExited:
    """The host agent finished; ``cause`` is set when it failed without a rank saying why."""

    host: str
    exit_code: int
    tail: tuple[str, ...]
    ts: float
    cause: Failure | None = None


@dataclass(frozen=True)
class Progress:
    """A step of the controller itself (starting agents, waiting for rendezvous, …)."""

    text: str
    ts: float


@dataclass(frozen=True)
class Restarting:
    """The run failed and will be started again (attempt ``attempt``, 1-based count of
    restarts) after ``delay`` seconds, because of ``cause``."""

    attempt: int
    cause: Failure
    delay: float
    ts: float


@dataclass(frozen=True)
class Heartbeat:
    """A rank is alive and says what it does (see :data:`dmlctl.protocol.BEAT_KEYS`):
    ``progress`` grows with its steps; ``armed`` while steps are expected."""

    host: str
    rank: int
    progress: int
    ts: float
    armed: bool = False
    since: float | None = None
    phase: str | None = None
    phase_s: float | None = None
    limit: float | None = None
    step_s: float | None = None
    where: str | None = None
    inner: str | None = None
    coll: Mapping[str, Collective] = field(default_factory=dict)
    stage: str | None = None  # what a rank that has not stepped yet is doing


@dataclass(frozen=True)
class ProcUsage:
    """A rank's process tree as its host agent saw it in ``/proc``: state letter
    (``R``, ``S``, ``T`` stopped, …), CPU seconds and I/O bytes used so far."""

    state: str
    cpu: float
    io: int


@dataclass(frozen=True)
class ProcSample:
    """The host agent's once-a-second look at every rank process it runs."""

    host: str
    procs: Mapping[int, ProcUsage]
    ts: float


@dataclass(frozen=True)
class StackDump:
    """The Python stacks of every thread of a rank, taken on a suspected hang;
    ``where``/``inner`` locate its main thread (the script's innermost frame, the
    innermost frame), as the agent read them from the dump."""

    host: str
    rank: int
    lines: tuple[str, ...]
    ts: float
    where: str | None = None
    inner: str | None = None


@dataclass(frozen=True)
class StacksDumped:
    """A host agent sent every stack dump it could take; ``stopped`` ranks' processes
    are stopped (SIGSTOP) and could not dump their own stack."""

    host: str
    stopped: tuple[int, ...]
    ts: float


@dataclass(frozen=True)
class Prepared:
    """A rank let the job's strategy wrap its model (``ctx.prepare``)."""

    host: str
    rank: int
    strategy: str
    ts: float


@dataclass(frozen=True)
class CheckpointSaved:
    """A rank committed checkpoint ``step`` in ``directory`` on ``host`` (one per
    directory: per host with host-local checkpoint directories)."""

    host: str
    rank: int
    step: int
    directory: str
    ts: float


@dataclass(frozen=True)
class CheckpointCopied:
    """The controller holds a complete, verified copy of checkpoint ``step``."""

    step: int
    ts: float


@dataclass(frozen=True)
class Resized:
    """The next attempt runs on other hosts (a host was lost, or came back):
    ``ranks`` is ``(rank, host, role)`` per planned rank; ``note`` says why."""

    ranks: tuple[tuple[int, str, str], ...]
    note: str
    ts: float


@dataclass(frozen=True)
class StopRequested:
    """The user asked to stop (Ctrl-C, ``dmlctl stop``)."""

    reason: str
    ts: float


@dataclass(frozen=True)
class ControllerFailed:
    """The controller cannot carry the run on (its disk is full, its run directory was
    deleted): ``cause`` (host ``controller``) becomes the root cause and the run stops."""

    cause: Failure
    ts: float


@dataclass(frozen=True)
class Finished:
    """Every agent is gone; the controller closes the run."""

    ts: float
    extra: Mapping[str, str] = field(default_factory=dict)


Event = (
    LogLines
    | MetricRecord
    | RankStarted
    | RankExited
    | RankRespawned
    | HostReplaced
    | HostDropped
    | AgentStarted
    | AgentExited
    | Progress
    | Restarting
    | Heartbeat
    | ProcSample
    | StackDump
    | StacksDumped
    | Prepared
    | CheckpointSaved
    | CheckpointCopied
    | Resized
    | StopRequested
    | ControllerFailed
    | Finished
)
