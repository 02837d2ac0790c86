"""The immutable run state and the pure reducer that folds events into it.

``apply(state, events)`` never mutates its input and never does I/O; the supervisor
calls it with batches of events, persists the result and hands it to the UI.

Phases: ``pending → starting → running → (stopping) → succeeded | failed | stopped``.
``lost`` is never produced here: readers (``dmlctl status``) use it for a run whose
controller died before the run reached a final phase.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dmlctl.errors import ExitCode
from dmlctl.failure import Evidence, Failure, Kind, exit_kind, failure_from_dict, pick_root_cause
from dmlctl.mesh import MeshLayout, layout_from
from dmlctl.protocol import COMM_TOTALS
from dmlctl.runs.comm import CommTotals, added
from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    CheckpointCopied,
    CheckpointSaved,
    ControllerFailed,
    Event,
    Finished,
    Heartbeat,
    LogLines,
    MetricRecord,
    Prepared,
    Progress,
    RankExited,
    RankStarted,
    Resized,
    Restarting,
    StopRequested,
    Stream,
)

TAIL_LINES = 100
NO_STRATEGY = "none"  # what a run whose script never called ctx.prepare ran with


class Phase(str, Enum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED, Phase.LOST)


class RankStatus(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (RankStatus.SUCCEEDED, RankStatus.FAILED, RankStatus.STOPPED)


@dataclass(frozen=True)
class RankState:
    """What is known about one rank."""

    rank: int
    host: str
    role: str = "worker"
    status: RankStatus = RankStatus.PENDING
    local_rank: int | None = None
    pid: int | None = None
    step: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    metrics: Mapping[str, float | int | str | bool | None] = field(default_factory=dict)
    last_line: str = ""
    lines: int = 0
    exit_code: int | None = None
    comm: CommTotals | None = None  # the newest totals of the rank's current process
    comm_before: CommTotals | None = None  # its earlier processes in this run, added
    stage: str | None = None  # before its first step: joining, first step, importing

    def comm_run(self) -> CommTotals | None:
        """This rank's communication totals over the whole run (every process it ran
        as, each up to its newest record), or None when no record carried totals."""
        return added(self.comm_before, self.comm)


@dataclass(frozen=True)
class TailLine:
    """One line of the merged log tail shown by the dashboard."""

    host: str
    rank: int | None
    stream: Stream
    text: str


@dataclass(frozen=True)
class RunState:
    """Everything the dashboard, ``state.json`` and ``dmlctl status`` show about a run."""

    run_id: str
    job: str
    strategy: str
    world_size: int
    hosts: tuple[str, ...]
    created_at: float
    phase: Phase = Phase.PENDING
    detail: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    restarts: int = 0
    ranks: tuple[RankState, ...] = ()
    root_cause: Failure | None = None  # of this attempt's failures, the one that explains them
    failures: tuple[Failure, ...] = ()  # the cause of every attempt that failed
    seen: tuple[Failure, ...] = ()  # every failure of this attempt, in arrival order
    tail: tuple[TailLine, ...] = ()
    stop_reason: str | None = None
    exit_code: int | None = None
    checkpoint_step: int | None = None  # newest checkpoint a rank committed
    checkpoint_copied: int | None = None  # newest complete copy on the controller
    prepared: bool = False  # a rank let the strategy wrap its model (ctx.prepare)
    mesh: MeshLayout | None = None  # the plan's device mesh (the job's parallelism:)

    def elapsed(self, now: float) -> float:
        """Seconds since the run was created, frozen once it ended."""
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.created_at)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (enums as strings, tuples as lists)."""
        out: dict[str, Any] = dataclasses.asdict(self)
        out["phase"] = self.phase.value
        for rank in out["ranks"]:
            rank["status"] = RankStatus(rank["status"]).value
        for line in out["tail"]:
            line["stream"] = Stream(line["stream"]).value
        return out

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> RunState:
        """Inverse of :meth:`to_dict`."""
        cause = data.get("root_cause")
        return RunState(
            run_id=data["run_id"],
            job=data["job"],
            strategy=data["strategy"],
            world_size=int(data["world_size"]),
            hosts=tuple(data["hosts"]),
            created_at=float(data["created_at"]),
            phase=_phase(data["phase"]),
            detail=data.get("detail", ""),
            started_at=data.get("started_at"),
            ended_at=data.get("ended_at"),
            restarts=int(data.get("restarts", 0)),
            ranks=tuple(_rank_from(r) for r in data["ranks"]),
            root_cause=failure_from_dict(cause) if cause else None,
            failures=tuple(failure_from_dict(c) for c in data.get("failures", ())),
            seen=tuple(failure_from_dict(c) for c in data.get("seen", ())),
            tail=tuple(TailLine(**{**t, "stream": Stream(t["stream"])}) for t in data["tail"]),
            stop_reason=data.get("stop_reason"),
            exit_code=data.get("exit_code"),
            checkpoint_step=data.get("checkpoint_step"),
            checkpoint_copied=data.get("checkpoint_copied"),
            prepared=bool(data.get("prepared", False)),
            mesh=layout_from(data["mesh"]) if data.get("mesh") else None,
        )


def _rank_from(data: Mapping[str, Any]) -> RankState:
    """A rank of :meth:`RunState.to_dict` (an older ``state.json`` has no totals)."""
    return RankState(
        **{
            **data,
            "status": RankStatus(data["status"]),
            "comm": CommTotals.from_dict(data.get("comm")),
            "comm_before": CommTotals.from_dict(data.get("comm_before")),
        }
    )


def new_run_state(
    run_id: str,
    job: str,
    strategy: str,
    ranks: Sequence[tuple[int, str, str]],
    created_at: float,
    mesh: MeshLayout | None = None,
) -> RunState:
    """Initial state from the plan: ``ranks`` is ``(rank, host, role)`` per planned rank,
    ``mesh`` the plan's device mesh (shown by the dashboard and ``dmlctl status``)."""
    hosts = tuple(dict.fromkeys(host for _, host, _ in ranks))
    return RunState(
        run_id=run_id,
        job=job,
        strategy=strategy,
        world_size=len(ranks),
        hosts=hosts,
        created_at=created_at,
        ranks=tuple(RankState(rank=r, host=h, role=role) for r, h, role in ranks),
        mesh=mesh,
    )


def _as_float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class _Fold:
    """The changes :func:`apply` is making to one state: run fields, rank updates and
    the tail, each read back as if already made (the handlers below write here)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.ranks: dict[int, RankState] = {r.rank: r for r in state.ranks}
        self.updates: dict[int, dict[str, Any]] = {}
        self.tail = list(state.tail)
        self.changed: dict[str, Any] = {}

    def upd(self, rank: int, host: str) -> dict[str, Any]:
        """The pending changes of ``rank`` (a rank not known yet is added on ``host``)."""
        if rank not in self.ranks:
            self.ranks[rank] = RankState(rank=rank, host=host)
        return self.updates.setdefault(rank, {})

    def current(self, rank: int, key: str) -> Any:
        """Rank field ``key`` with the pending changes."""
        pending = self.updates.get(rank, {})
        return pending[key] if key in pending else getattr(self.ranks[rank], key)

    def get(self, key: str) -> Any:
        """Run field ``key`` with the pending changes."""
        return self.changed[key] if key in self.changed else getattr(self.state, key)

    def result(self) -> RunState:
        """The new state."""
        new_ranks = tuple(
            dataclasses.replace(self.ranks[r], **self.updates[r])
            if r in self.updates
            else self.ranks[r]
            for r in sorted(self.ranks)
        )
        tail = self.tail[-TAIL_LINES:] if len(self.tail) > TAIL_LINES else self.tail
        return dataclasses.replace(self.state, **self.changed, ranks=new_ranks, tail=tuple(tail))


def _log_lines(f: _Fold, ev: LogLines) -> None:
    if not ev.lines or ev.stream is Stream.TORCHRUN:  # in the logs, never on screen
        return
    f.tail += [TailLine(ev.host, ev.rank, ev.stream, t) for t in ev.lines[-TAIL_LINES:]]
    if len(f.tail) > 2 * TAIL_LINES:
        del f.tail[:-TAIL_LINES]
    if ev.rank is not None:
        u = f.upd(ev.rank, ev.host)
        u["last_line"] = ev.lines[-1]
        u["lines"] = f.current(ev.rank, "lines") + len(ev.lines)


def _metric_record(f: _Fold, ev: MetricRecord) -> None:
    u = f.upd(ev.rank, ev.host)
    u["step"] = ev.step
    values = {k: v for k, v in ev.values.items() if k not in COMM_TOTALS}
    u["metrics"] = {**f.current(ev.rank, "metrics"), **values}
    if (totals := CommTotals.from_values(ev.values)) is not None:
        u["comm"] = totals
    if (loss := _as_float(ev.values.get("loss"))) is not None:
        u["loss"] = loss
    if (sps := _as_float(ev.values.get("samples_per_s"))) is not None:
        u["samples_per_s"] = sps


def _rank_started(f: _Fold, ev: RankStarted) -> None:
    u = f.upd(ev.rank, ev.host)
    if (comm := f.current(ev.rank, "comm")) is not None:
        # A new process, whose meter counts from zero: keep the earlier ones' totals.
        u.update(comm=None, comm_before=added(f.current(ev.rank, "comm_before"), comm))
    u.update(
        host=ev.host,
        local_rank=ev.local_rank,
        role=ev.role,
        pid=ev.pid,
        status=RankStatus.RUNNING,
    )
    if f.get("started_at") is None:
        f.changed["started_at"] = ev.ts
    if not f.get("phase").terminal and f.get("phase") != Phase.STOPPING:
        f.changed["phase"] = Phase.RUNNING
        f.changed["detail"] = ""


def _rank_exited(f: _Fold, ev: RankExited) -> None:
    u = f.upd(ev.rank, ev.host)
    u["exit_code"] = ev.exit_code
    if f.get("phase") == Phase.STOPPING and (ev.cause is None or ev.exit_code == 0):
        u["status"] = RankStatus.STOPPED  # whatever its SIGTERM handler returned
    elif ev.exit_code == 0:
        u["status"] = RankStatus.SUCCEEDED
    else:
        u["status"] = RankStatus.FAILED
        cause = ev.cause or Failure(
            ev.host,
            ev.rank,
            "ExitCode",
            f"exited with code {ev.exit_code}",
            (),
            ev.ts,
            kind=exit_kind(ev.exit_code),
            evidence=Evidence.EXIT,
        )
        if f.get("phase") != Phase.STOPPING:
            _failed(f, cause)


def _agent_started(f: _Fold, ev: AgentStarted) -> None:
    if f.get("phase") == Phase.PENDING:
        f.changed["phase"] = Phase.STARTING


def _agent_exited(f: _Fold, ev: AgentExited) -> None:
    stopping = f.get("phase") == Phase.STOPPING
    failed = ev.exit_code != 0 and not stopping
    if failed:
        _agent_failed(f, ev)
    for rank in list(f.ranks):
        if f.current(rank, "host") != ev.host or RankStatus(f.current(rank, "status")).terminal:
            continue
        cause = f.get("root_cause")
        blamed = (
            failed and cause is not None and cause.host == ev.host and cause.rank in (rank, None)
        )
        f.upd(rank, ev.host)["status"] = (
            RankStatus.FAILED if blamed and not stopping else RankStatus.STOPPED
        )


def _agent_failed(f: _Fold, ev: AgentExited) -> None:
    """The root cause an agent's failed exit gives the run, if it explains better."""
    message = f"torchrun exited with code {ev.exit_code}"
    cause = ev.cause or Failure(
        ev.host, None, "AgentExit", message, ev.tail, ev.ts, kind=Kind.AGENT, evidence=Evidence.EXIT
    )
    # A rank killed without a word (SIGKILL) is only named by torchrun's summary, after
    # its peers' collateral errors have arrived.
    _failed(f, cause)


def _failed(f: _Fold, failure: Failure) -> None:
    """One more failure of this attempt; the root cause is the one that explains them."""
    f.changed["seen"] = seen = (*f.get("seen"), failure)
    f.changed["root_cause"] = pick_root_cause(seen)


def _progress(f: _Fold, ev: Progress) -> None:
    f.changed["detail"] = ev.text
    if f.get("phase") == Phase.PENDING:
        f.changed["phase"] = Phase.STARTING


def _restarting(f: _Fold, ev: Restarting) -> None:
    f.changed["phase"] = Phase.RESTARTING
    f.changed["restarts"] = ev.attempt
    f.changed["failures"] = (*f.get("failures"), ev.cause)
    f.changed["root_cause"], f.changed["seen"] = None, ()
    f.changed["detail"] = f"restart {ev.attempt} in {ev.delay:.0f} s after {ev.cause.headline()}"
    for rank in list(f.ranks):
        f.upd(rank, f.ranks[rank].host).update(status=RankStatus.PENDING, exit_code=None, pid=None)


def _prepared(f: _Fold, ev: Prepared) -> None:
    f.changed["prepared"] = True


def _checkpoint_saved(f: _Fold, ev: CheckpointSaved) -> None:
    if f.get("checkpoint_step") is None or ev.step > f.get("checkpoint_step"):
        f.changed["checkpoint_step"] = ev.step


def _checkpoint_copied(f: _Fold, ev: CheckpointCopied) -> None:
    f.changed["checkpoint_copied"] = ev.step


def _resized(f: _Fold, ev: Resized) -> None:
    f.ranks = {r: RankState(rank=r, host=h, role=role) for r, h, role in ev.ranks}
    f.updates.clear()
    f.changed["hosts"] = tuple(dict.fromkeys(h for _, h, _ in ev.ranks))
    f.changed["world_size"] = len(ev.ranks)
    f.changed["detail"] = ev.note


def _stop_requested(f: _Fold, ev: StopRequested) -> None:
    if not f.get("phase").terminal:
        f.changed["phase"] = Phase.STOPPING
        f.changed["stop_reason"] = ev.reason


def _controller_failed(f: _Fold, ev: ControllerFailed) -> None:
    # Whatever else happened, the run's own records are incomplete: it failed.
    _failed(f, ev.cause)


def _finished(f: _Fold, ev: Finished) -> None:
    f.changed["ended_at"] = ev.ts
    for rank in list(f.ranks):
        if not RankStatus(f.current(rank, "status")).terminal:
            f.upd(rank, f.ranks[rank].host)["status"] = RankStatus.STOPPED
    statuses = [RankStatus(f.current(r, "status")) for r in f.ranks]
    if f.get("stop_reason") is not None and f.get("root_cause") is None:
        # A stop is a stop, whatever the ranks' SIGTERM handlers returned.
        f.changed["phase"], f.changed["exit_code"] = Phase.STOPPED, int(ExitCode.INTERRUPTED)
    elif (
        f.get("root_cause") is None
        and statuses
        and all(st == RankStatus.SUCCEEDED for st in statuses)
    ):
        f.changed["phase"], f.changed["exit_code"] = Phase.SUCCEEDED, int(ExitCode.OK)
        if not f.get("prepared"):  # every rank ran without ctx.prepare
            f.changed["strategy"] = NO_STRATEGY
    else:
        f.changed["phase"], f.changed["exit_code"] = Phase.FAILED, int(ExitCode.RUN_FAILED)
    f.changed["detail"] = ""


def _heartbeat(f: _Fold, ev: Heartbeat) -> None:
    """A rank's start-up stage, while it has one (None once it stepped)."""
    if ev.rank in f.ranks and f.current(ev.rank, "stage") != ev.stage:
        f.upd(ev.rank, ev.host)["stage"] = ev.stage


_HANDLERS: dict[type, Callable[[_Fold, Any], None]] = {
    LogLines: _log_lines,
    Heartbeat: _heartbeat,
    MetricRecord: _metric_record,
    RankStarted: _rank_started,
    RankExited: _rank_exited,
    AgentStarted: _agent_started,
    AgentExited: _agent_exited,
    Progress: _progress,
    Restarting: _restarting,
    Prepared: _prepared,
    CheckpointSaved: _checkpoint_saved,
    CheckpointCopied: _checkpoint_copied,
    Resized: _resized,
    StopRequested: _stop_requested,
    ControllerFailed: _controller_failed,
    Finished: _finished,
}
"""How each event type changes the state; the other types (samples, stack dumps …)
leave it as it is."""


def apply(state: RunState, events: Iterable[Event]) -> RunState:
    """Fold ``events`` (in order) into ``state`` and return the new state.

    Pure: ``state`` is not changed. Cost is linear in the number of events, with one
    copy of each touched rank per call, so callers should pass batches.
    """
    fold = _Fold(state)
    for ev in events:
        handler = _HANDLERS.get(type(ev))
        if handler is not None:
            handler(fold, ev)
    return fold.result()


def phase_exit_code(state: RunState) -> int:
    """The launch exit code for a final state."""
    if state.exit_code is not None:
        return state.exit_code
    return 0 if state.phase == Phase.SUCCEEDED else 1


def _phase(value: Any) -> Phase:
    """``value`` as a :class:`Phase`; ValueError naming the field and the phases."""
    try:
        return Phase(value)
    except ValueError:
        known = ", ".join(p.value for p in Phase)
        raise ValueError(f"phase {value!r} is not one of {known}") from None
