"""The immutable run state and the pure reducer that folds events into it.

``apply(state, events)`` never mutates its input and never does I/O; the supervisor
calls it with batches of events, persists the result and hands it to the UI.

Phases: ``pending → starting → running → (stopping) → succeeded | failed | stopped``.
``lost`` is never produced here: readers (``dmlctl status``) use it for a run whose
controller died before the run reached a final phase.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dmlctl.errors import ExitCode
from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    CheckpointCopied,
    CheckpointSaved,
    ControllerFailed,
    Event,
    Finished,
    LogLines,
    MetricRecord,
    Prepared,
    Progress,
    RankExited,
    RankStarted,
    Resized,
    Restarting,
    RootCause,
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
    root_cause: RootCause | None = None
    failures: tuple[RootCause, ...] = ()  # the cause of every attempt that failed
    tail: tuple[TailLine, ...] = ()
    stop_reason: str | None = None
    exit_code: int | None = None
    checkpoint_step: int | None = None  # newest checkpoint a rank committed
    checkpoint_copied: int | None = None  # newest complete copy on the controller
    prepared: bool = False  # a rank let the strategy wrap its model (ctx.prepare)

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
            phase=Phase(data["phase"]),
            detail=data.get("detail", ""),
            started_at=data.get("started_at"),
            ended_at=data.get("ended_at"),
            restarts=int(data.get("restarts", 0)),
            ranks=tuple(
                RankState(**{**r, "status": RankStatus(r["status"])}) for r in data["ranks"]
            ),
            root_cause=_cause_from(cause) if cause else None,
            failures=tuple(_cause_from(c) for c in data.get("failures", ())),
            tail=tuple(TailLine(**{**t, "stream": Stream(t["stream"])}) for t in data["tail"]),
            stop_reason=data.get("stop_reason"),
            exit_code=data.get("exit_code"),
            checkpoint_step=data.get("checkpoint_step"),
            checkpoint_copied=data.get("checkpoint_copied"),
            prepared=bool(data.get("prepared", False)),
        )


def _cause_from(data: Mapping[str, Any]) -> RootCause:
    return RootCause(**{**data, "traceback": tuple(data["traceback"])})


def new_run_state(
    run_id: str,
    job: str,
    strategy: str,
    ranks: Sequence[tuple[int, str, str]],
    created_at: float,
) -> RunState:
    """Initial state from the plan: ``ranks`` is ``(rank, host, role)`` per planned rank."""
    hosts = tuple(dict.fromkeys(host for _, host, _ in ranks))
    return RunState(
        run_id=run_id,
        job=job,
        strategy=strategy,
        world_size=len(ranks),
        hosts=hosts,
        created_at=created_at,
        ranks=tuple(RankState(rank=r, host=h, role=role) for r, h, role in ranks),
    )


def _as_float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _explains_better(new: RootCause, old: RootCause | None) -> bool:
    """Whether ``new`` is a better root cause than ``old``: a rank's own error beats a
    collateral one (a collective that failed because a peer died), then the earlier
    failure wins. Arrival order alone would often blame the wrong rank."""
    if old is None:
        return True
    return (new.collateral, new.ts) < (old.collateral, old.ts)


def apply(state: RunState, events: Iterable[Event]) -> RunState:
    """Fold ``events`` (in order) into ``state`` and return the new state.

    Pure: ``state`` is not changed. Cost is linear in the number of events, with one
    copy of each touched rank per call, so callers should pass batches.
    """
    ranks: dict[int, RankState] = {r.rank: r for r in state.ranks}
    updates: dict[int, dict[str, Any]] = {}
    tail = list(state.tail)
    s: dict[str, Any] = {}

    def upd(rank: int, host: str) -> dict[str, Any]:
        if rank not in ranks:
            ranks[rank] = RankState(rank=rank, host=host)
        return updates.setdefault(rank, {})

    def current(rank: int, key: str) -> Any:
        pending = updates.get(rank, {})
        return pending[key] if key in pending else getattr(ranks[rank], key)

    def get(key: str) -> Any:
        return s[key] if key in s else getattr(state, key)

    for ev in events:
        if isinstance(ev, LogLines):
            if not ev.lines:
                continue
            tail += [TailLine(ev.host, ev.rank, ev.stream, t) for t in ev.lines[-TAIL_LINES:]]
            if len(tail) > 2 * TAIL_LINES:
                del tail[:-TAIL_LINES]
            if ev.rank is not None:
                u = upd(ev.rank, ev.host)
                u["last_line"] = ev.lines[-1]
                u["lines"] = current(ev.rank, "lines") + len(ev.lines)
        elif isinstance(ev, MetricRecord):
            u = upd(ev.rank, ev.host)
            u["step"] = ev.step
            u["metrics"] = {**current(ev.rank, "metrics"), **ev.values}
            if (loss := _as_float(ev.values.get("loss"))) is not None:
                u["loss"] = loss
            if (sps := _as_float(ev.values.get("samples_per_s"))) is not None:
                u["samples_per_s"] = sps
        elif isinstance(ev, RankStarted):
            u = upd(ev.rank, ev.host)
            u.update(
                host=ev.host,
                local_rank=ev.local_rank,
                role=ev.role,
                pid=ev.pid,
                status=RankStatus.RUNNING,
            )
            if get("started_at") is None:
                s["started_at"] = ev.ts
            if not get("phase").terminal and get("phase") != Phase.STOPPING:
                s["phase"] = Phase.RUNNING
                s["detail"] = ""
        elif isinstance(ev, RankExited):
            u = upd(ev.rank, ev.host)
            u["exit_code"] = ev.exit_code
            if get("phase") == Phase.STOPPING and (ev.cause is None or ev.exit_code == 0):
                u["status"] = RankStatus.STOPPED  # whatever its SIGTERM handler returned
            elif ev.exit_code == 0:
                u["status"] = RankStatus.SUCCEEDED
            else:
                u["status"] = RankStatus.FAILED
                cause = ev.cause or RootCause(
                    ev.host, ev.rank, "ExitCode", f"exited with code {ev.exit_code}", (), ev.ts
                )
                if get("phase") != Phase.STOPPING and _explains_better(cause, get("root_cause")):
                    s["root_cause"] = cause
        elif isinstance(ev, AgentStarted):
            if get("phase") == Phase.PENDING:
                s["phase"] = Phase.STARTING
        elif isinstance(ev, AgentExited):
            stopping = get("phase") == Phase.STOPPING
            failed = ev.exit_code != 0 and not stopping
            if failed:
                cause = ev.cause or RootCause(
                    ev.host,
                    None,
                    "AgentExit",
                    f"torchrun exited with code {ev.exit_code}",
                    ev.tail,
                    ev.ts,
                )
                # A rank killed without a word (SIGKILL) is only named by torchrun's
                # summary, after its peers' collateral errors have arrived.
                known = get("root_cause")
                if known is None or (
                    ev.cause is not None
                    and known.collateral
                    and not cause.collateral
                    and (cause.rank != known.rank or cause.host != known.host)
                ):
                    s["root_cause"] = cause
            for rank in list(ranks):
                if current(rank, "host") != ev.host or RankStatus(current(rank, "status")).terminal:
                    continue
                cause = get("root_cause")
                blamed = (
                    failed
                    and cause is not None
                    and cause.host == ev.host
                    and cause.rank in (rank, None)
                )
                upd(rank, ev.host)["status"] = (
                    RankStatus.FAILED if blamed and not stopping else RankStatus.STOPPED
                )
        elif isinstance(ev, Progress):
            s["detail"] = ev.text
            if get("phase") == Phase.PENDING:
                s["phase"] = Phase.STARTING
        elif isinstance(ev, Restarting):
            s["phase"] = Phase.RESTARTING
            s["restarts"] = ev.attempt
            s["failures"] = (*get("failures"), ev.cause)
            s["root_cause"] = None
            s["detail"] = f"restart {ev.attempt} in {ev.delay:.0f} s after {ev.cause.headline()}"
            for rank in list(ranks):
                upd(rank, ranks[rank].host).update(
                    status=RankStatus.PENDING, exit_code=None, pid=None
                )
        elif isinstance(ev, Prepared):
            s["prepared"] = True
        elif isinstance(ev, CheckpointSaved):
            if get("checkpoint_step") is None or ev.step > get("checkpoint_step"):
                s["checkpoint_step"] = ev.step
        elif isinstance(ev, CheckpointCopied):
            s["checkpoint_copied"] = ev.step
        elif isinstance(ev, Resized):
            ranks = {r: RankState(rank=r, host=h, role=role) for r, h, role in ev.ranks}
            updates.clear()
            s["hosts"] = tuple(dict.fromkeys(h for _, h, _ in ev.ranks))
            s["world_size"] = len(ev.ranks)
            s["detail"] = ev.note
        elif isinstance(ev, StopRequested):
            if not get("phase").terminal:
                s["phase"] = Phase.STOPPING
                s["stop_reason"] = ev.reason
        elif isinstance(ev, ControllerFailed):
            # Whatever else happened, the run's own records are incomplete: it failed.
            known = get("root_cause")
            if known is None or known.collateral:
                s["root_cause"] = ev.cause
        elif isinstance(ev, Finished):
            s["ended_at"] = ev.ts
            for rank in list(ranks):
                if not RankStatus(current(rank, "status")).terminal:
                    upd(rank, ranks[rank].host)["status"] = RankStatus.STOPPED
            statuses = [RankStatus(current(r, "status")) for r in ranks]
            if get("stop_reason") is not None and get("root_cause") is None:
                # A stop is a stop, whatever the ranks' SIGTERM handlers returned.
                s["phase"], s["exit_code"] = Phase.STOPPED, int(ExitCode.INTERRUPTED)
            elif (
                get("root_cause") is None
                and statuses
                and all(st == RankStatus.SUCCEEDED for st in statuses)
            ):
                s["phase"], s["exit_code"] = Phase.SUCCEEDED, int(ExitCode.OK)
                if not get("prepared"):  # every rank ran without ctx.prepare
                    s["strategy"] = NO_STRATEGY
            else:
                s["phase"], s["exit_code"] = Phase.FAILED, int(ExitCode.RUN_FAILED)
            s["detail"] = ""

    new_ranks = tuple(
        dataclasses.replace(ranks[r], **updates[r]) if r in updates else ranks[r]
        for r in sorted(ranks)
    )
    if len(tail) > TAIL_LINES:
        tail = tail[-TAIL_LINES:]
    return dataclasses.replace(state, **s, ranks=new_ranks, tail=tuple(tail))


def phase_exit_code(state: RunState) -> int:
    """The launch exit code for a final state."""
    if state.exit_code is not None:
        return state.exit_code
    return 0 if state.phase == Phase.SUCCEEDED else 1
