"""The immutable run state: a run's phase, ranks, failures and tail, and its JSON form.

:mod:`dmlctl.runs.reducer` folds events into it (``apply``); the supervisor persists
the result and hands it to the UI.

Phases: ``pending → starting → running → (stopping) → succeeded | failed | stopped``.
``lost`` is never produced by the reducer: readers (``dmlctl status``) use it for a run
whose controller died before the run reached a final phase.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dmlctl.failure import Failure, failure_from_dict
from dmlctl.mesh import MeshLayout, layout_from
from dmlctl.runs.comm import CommTotals, added
from dmlctl.runs.events import Stream

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
    RECOVERING = "recovering"  # its process died and a new one joins in place
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    DROPPED = "dropped"  # its host was lost and the others went on without it (in place)
    UNKNOWN = "unknown"  # the run's controller is gone: nobody knows what became of it

    @property
    def terminal(self) -> bool:
        return self in (
            RankStatus.SUCCEEDED,
            RankStatus.FAILED,
            RankStatus.STOPPED,
            RankStatus.DROPPED,
        )


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
    peer_failed: bool = False  # stopped because another rank failed (its own end collateral)

    def comm_run(self) -> CommTotals | None:
        """This rank's communication totals over the whole run (every process it ran
        as, each up to its newest record), or None when no record carried totals."""
        return added(self.comm_before, self.comm)


@dataclass(frozen=True)
class Replacement:
    """A rank started again in place (``restart.mode: in_place``): when its death was
    seen (``lost_at``) and why (``cause``, the failure's message), and when its
    replacement logged its first record (``back_at``, at ``step``; None until then),
    and where in its data it was then (``progress``, the share of its data taken, and
    ``epoch``, when the script's data comes through ``ctx.shard``): a script that keeps
    its own step counter starts it again, its data position goes on."""

    rank: int
    host: str
    lost_at: float
    cause: str
    back_at: float | None = None
    step: int | None = None
    progress: float | None = None
    epoch: int | None = None

    @property
    def gap_s(self) -> float | None:
        """Seconds the rank logged nothing: from its loss to its replacement's record."""
        return None if self.back_at is None else max(0.0, self.back_at - self.lost_at)


SEPARATOR = ""
"""The ``host`` of a tail line that is no one's: where a new attempt's lines begin."""


@dataclass(frozen=True)
class TailLine:
    """One line of the merged log tail shown by the dashboard (``host`` :data:`SEPARATOR`:
    the line between two attempts, ``text`` naming the next)."""

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
    restarts: int = 0  # attempts after the first (restarts and resumes)
    resumes: int = 0  # of those, the ones dmlctl launch --resume made (they spend no budget)
    respawns: int = 0  # ranks started again in place (restart.mode: in_place)
    replacements: tuple[Replacement, ...] = ()  # each of those, in order
    ranks: tuple[RankState, ...] = ()
    root_cause: Failure | None = None  # of this attempt's failures, the one that explains them
    failures: tuple[Failure, ...] = ()  # the cause of every attempt that failed
    seen: tuple[Failure, ...] = field(default=(), compare=False)
    """Every failure of this attempt, in arrival order (the reducer's working set: not
    stored, not compared)."""
    tail: tuple[TailLine, ...] = ()
    stop_reason: str | None = None
    exit_code: int | None = None
    checkpoint_step: int | None = None  # newest checkpoint a rank committed
    checkpoint_copied: int | None = None  # newest complete copy on the controller
    prepared: bool = False  # a rank let the strategy wrap its model (ctx.prepare)
    mesh: MeshLayout | None = None  # the plan's device mesh (the job's parallelism:)

    def strategy_label(self) -> str:
        """The strategy the run trains with: the job's once a rank let it wrap its model
        (``ctx.prepare``); ``none`` once ranks trained or ended without that (a plain
        torchrun script, a Trainer's); the job's until either is known."""
        if self.prepared:
            return self.strategy
        if self.ended_at is not None or any(r.step for r in self.ranks):
            return NO_STRATEGY
        return self.strategy

    @property
    def restarted(self) -> int:
        """Restarts the restart policy made (a resume is none: it spends no budget)."""
        return self.restarts - self.resumes

    def lost(self) -> RunState:
        """This run, its controller gone: ``lost``, its ranks that had not ended
        ``unknown`` (nobody watches them), and how to go on."""
        unknown = RankStatus.UNKNOWN
        ranks = tuple(
            r if r.status.terminal else dataclasses.replace(r, status=unknown) for r in self.ranks
        )
        detail = (
            f"controller is gone: dmlctl launch --resume {self.run_id} goes on from its newest "
            "checkpoint"
        )
        return dataclasses.replace(self, phase=Phase.LOST, detail=detail, ranks=ranks)

    def elapsed(self, now: float) -> float:
        """Seconds since the run was created, frozen once it ended."""
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.created_at)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (enums as strings, tuples as lists; failures as
        :meth:`Failure.to_dict` writes them; without ``seen``)."""
        bare = dataclasses.replace(self, root_cause=None, failures=(), seen=())
        out: dict[str, Any] = dataclasses.asdict(bare)
        del out["seen"]
        out["root_cause"] = self.root_cause.to_dict() if self.root_cause else None
        out["failures"] = [f.to_dict() for f in self.failures]
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
            resumes=int(data.get("resumes", 0)),
            respawns=int(data.get("respawns", 0)),
            replacements=tuple(Replacement(**r) for r in data.get("replacements", ())),
            ranks=tuple(_rank_from(r) for r in data["ranks"]),
            root_cause=failure_from_dict(cause) if cause else None,
            failures=tuple(failure_from_dict(c) for c in data.get("failures", ())),
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
