"""The pure reducer that folds events into a run's state.

``apply(state, events)`` never mutates its input and never does I/O; the supervisor
calls it with batches of events. An attempt's failures are kept in arrival order
(``RunState.seen``) and its root cause is the one :func:`dmlctl.failure.pick_root_cause`
chooses among them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from dmlctl.errors import ExitCode
from dmlctl.failure import Evidence, Failure, Kind, exit_kind, pick_root_cause
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
    HostDropped,
    HostReplaced,
    LogLines,
    MetricRecord,
    Prepared,
    Progress,
    RankExited,
    RankRespawned,
    RankStarted,
    Resized,
    Restarting,
    StopRequested,
    Stream,
)
from dmlctl.runs.state import (
    NO_STRATEGY,
    SEPARATOR,
    TAIL_LINES,
    Phase,
    RankState,
    RankStatus,
    Replacement,
    RunState,
    TailLine,
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
    if f.current(ev.rank, "status") is RankStatus.RECOVERING:
        u["status"] = RankStatus.RUNNING  # replaced in place, and at work again
        _back(f, ev)
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
    recovering = f.current(ev.rank, "status") is RankStatus.RECOVERING  # until it logs
    u.update(
        host=ev.host,
        local_rank=ev.local_rank,
        role=ev.role,
        pid=ev.pid,
        status=RankStatus.RECOVERING if recovering else RankStatus.RUNNING,
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
        u["peer_failed"] = _by_peer(f, ev.rank)
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


def _by_peer(f: _Fold, rank: int) -> bool:
    """Whether ``rank`` is being stopped because another rank failed (the attempt has a
    root cause on another rank; a stop the user asked for has none)."""
    root = f.get("root_cause")
    return root is not None and root.rank is not None and root.rank != rank


def _in_place(f: _Fold, cause: Failure) -> None:
    """A failure recovered in place: counted with the run's failures (and its restart
    budget), not this attempt's (the attempt goes on)."""
    f.changed["respawns"] = f.get("respawns") + 1
    f.changed["failures"] = (*f.get("failures"), dataclasses.replace(cause, recovered=True))


def _rank_respawned(f: _Fold, ev: RankRespawned) -> None:
    """A rank recovers in place (:func:`_in_place`), a replacement whose gap its first
    record closes."""
    f.upd(ev.rank, ev.host).update(status=RankStatus.RECOVERING, pid=ev.pid, exit_code=None)
    _in_place(f, ev.cause)
    gap = Replacement(ev.rank, ev.host, ev.ts, ev.cause.message)
    f.changed["replacements"] = (*f.get("replacements"), gap)


def _host_replaced(f: _Fold, ev: HostReplaced) -> None:
    """A lost host's ranks recover on another host: one failure of the run (as one
    host's loss restarts a run once), each rank a replacement on its new host."""
    for rank in ev.ranks:
        f.upd(rank, ev.to).update(
            host=ev.to, status=RankStatus.RECOVERING, pid=None, exit_code=None
        )
    _in_place(f, ev.cause)
    why = f"{ev.host} lost: {ev.cause.message}"
    gaps = tuple(Replacement(rank, ev.to, ev.cause.ts, why) for rank in ev.ranks)
    f.changed["replacements"] = (*f.get("replacements"), *gaps)
    hosts = f.get("hosts")
    f.changed["hosts"] = tuple(dict.fromkeys(ev.to if h == ev.host else h for h in hosts))


def _host_dropped(f: _Fold, ev: HostDropped) -> None:
    """A lost host's ranks are left out while the others go on: one failure of the
    run (as :func:`_host_replaced`), the ranks ``dropped`` (not a failure at the end)."""
    for rank in ev.ranks:
        f.upd(rank, ev.host).update(status=RankStatus.DROPPED, pid=None)
    _in_place(f, ev.cause)
    f.changed["hosts"] = tuple(h for h in f.get("hosts") if h != ev.host)


def _back(f: _Fold, ev: MetricRecord) -> None:
    """The first record of ``ev.rank``'s replacement closes its open gaps (more than
    one when a replacement died before it logged)."""
    progress, epoch = ev.values.get("progress"), ev.values.get("epoch")
    where = {
        "progress": float(progress) if isinstance(progress, int | float) else None,
        "epoch": epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
    }
    f.changed["replacements"] = tuple(
        dataclasses.replace(gap, back_at=ev.ts, step=ev.step, **where)
        if gap.rank == ev.rank and gap.back_at is None
        else gap
        for gap in f.get("replacements")
    )


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
        if blamed and not stopping:
            f.upd(rank, ev.host)["status"] = RankStatus.FAILED
        else:  # its agent ended with it: stopped, by a failed peer where the run has one
            f.upd(rank, ev.host).update(status=RankStatus.STOPPED, peer_failed=_by_peer(f, rank))


def _agent_failed(f: _Fold, ev: AgentExited) -> None:
    """The root cause an agent's failed exit gives the run, if it explains better."""
    if ev.cause is None and f.get("seen"):
        return  # says nothing another failure has not said better (a host the stop killed)
    message = f"torchrun exited with code {ev.exit_code}"
    cause = ev.cause or Failure(
        ev.host, None, "AgentExit", message, ev.tail, ev.ts, kind=Kind.AGENT, evidence=Evidence.EXIT
    )
    # A rank killed without a word (SIGKILL) is only named by torchrun's summary, after
    # its peers' collateral errors have arrived.
    _failed(f, cause)


def _failed(f: _Fold, failure: Failure) -> None:
    """One more failure of this attempt; the root cause is the one that explains them.
    A rank whose own end was a consequence of it (a collective broken by the failed
    peer, torchrun's SIGTERM) is shown stopped because its peer failed."""
    f.changed["seen"] = seen = (*f.get("seen"), failure)
    f.changed["root_cause"] = root = pick_root_cause(seen)
    for other in seen:
        rank = other.rank
        if rank is None or root is None or rank == root.rank or rank not in f.ranks:
            continue
        if other.collateral or other.kind in (Kind.COLLATERAL, Kind.KILLED):
            f.upd(rank, other.host).update(status=RankStatus.STOPPED, peer_failed=True)


def _progress(f: _Fold, ev: Progress) -> None:
    f.changed["detail"] = ev.text
    if f.get("phase") == Phase.PENDING:
        f.changed["phase"] = Phase.STARTING


def _restarting(f: _Fold, ev: Restarting) -> None:
    f.changed["phase"] = Phase.RESTARTING
    f.changed["restarts"] = ev.attempt
    if ev.cause.kind is Kind.CONTROLLER:  # dmlctl launch --resume: not the policy's
        f.changed["resumes"] = f.get("resumes") + 1
    f.changed["failures"] = (*f.get("failures"), ev.cause)
    f.changed["root_cause"], f.changed["seen"] = None, ()
    f.changed["detail"] = f"restart {ev.attempt} in {ev.delay:.0f} s after {ev.cause.headline()}"
    f.tail.append(TailLine(SEPARATOR, None, Stream.STDOUT, f"attempt {ev.attempt + 1}"))
    for rank in list(f.ranks):
        f.upd(rank, f.ranks[rank].host).update(
            status=RankStatus.PENDING, exit_code=None, pid=None, peer_failed=False
        )


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
            f.upd(rank, f.ranks[rank].host).update(
                status=RankStatus.STOPPED, peer_failed=_by_peer(f, rank)
            )
    statuses = [RankStatus(f.current(r, "status")) for r in f.ranks]
    if f.get("stop_reason") is not None and f.get("root_cause") is None:
        # A stop is a stop, whatever the ranks' SIGTERM handlers returned.
        f.changed["phase"], f.changed["exit_code"] = Phase.STOPPED, int(ExitCode.INTERRUPTED)
    elif (
        f.get("root_cause") is None
        and statuses
        and RankStatus.SUCCEEDED in statuses
        and all(st in (RankStatus.SUCCEEDED, RankStatus.DROPPED) for st in statuses)
    ):
        f.changed["phase"], f.changed["exit_code"] = Phase.SUCCEEDED, int(ExitCode.OK)
    else:
        f.changed["phase"], f.changed["exit_code"] = Phase.FAILED, int(ExitCode.RUN_FAILED)
    if not f.get("prepared"):  # every rank ran without ctx.prepare, whatever the outcome
        f.changed["strategy"] = NO_STRATEGY
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
    RankRespawned: _rank_respawned,
    HostReplaced: _host_replaced,
    HostDropped: _host_dropped,
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
