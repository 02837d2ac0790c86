"""Restart policy: a pure state machine that decides whether a failed run starts again.

Nothing here does I/O or reads a clock: the supervisor passes ``now`` (its monotonic
clock) in, feeds the signals it observed and carries out the returned :class:`Action`
(as torch's elastic agent acts on its workers' states): ``RESTART_NOW`` starts the next
attempt, ``GIVE_UP`` ends the run with ``last_cause``, ``STOP`` ends it stopped. Its
wait before a restart is RESTARTING plus ``Tick`` signals until ``RESTART_NOW``. Tests
script the signals (no processes), like the torch elastic agent's tests script its
monitor.

States and transitions (``*`` = any non-final phase)::

    STARTING --Started------------------------------> RUNNING
    STARTING | RUNNING --Succeeded------------------> SUCCEEDED
    STARTING | RUNNING --Failed(cause), budget left-> RESTARTING  (next_start_at = now + backoff)
    STARTING | RUNNING --Failed(cause), no budget---> FAILED      [GIVE_UP]
    RESTARTING --Tick, now >= next_start_at---------> STARTING    [RESTART_NOW] (attempt + 1)
    * --StopRequested-------------------------------> STOPPED     [STOP]
    SUCCEEDED | FAILED | STOPPED --anything---------> unchanged   [NONE]

Every other (phase, signal) pair leaves the state unchanged and returns ``NONE``; in
particular a ``Failed`` or ``Succeeded`` that arrives while RESTARTING belongs to the
attempt already given up on, so one attempt spends at most one restart however many
of its ranks report a failure.

One phase type, one stop event, one restart spec: the phases are the run's own
:class:`dmlctl.runs.state.Phase` (the machine uses six of its values; PENDING, STOPPING
and LOST belong to the run's record only), the stop signal is the run's own
:class:`dmlctl.runs.events.StopRequested` event, and the budgets and backoff are read
from the job file's typed ``restart:`` block, :class:`dmlctl.spec.restart.RestartSpec`.

Budgets: a failure spends one restart of its :class:`FailureKind` only. USER failures
(the training code's own fault) default to no restart; INFRA failures (signals, lost
hosts, hangs) default to three. The wait before a restart grows geometrically with the
attempt number and is capped (:func:`backoff`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from dmlctl.failure import Failure, Kind
from dmlctl.runs.events import RankExited, StopRequested
from dmlctl.runs.state import Phase, RunState
from dmlctl.spec.restart import RestartSpec

CONTROLLER_LOST = "ControllerLost"
"""The cause the supervisor records when it resumes a run whose controller died."""


class FailureKind(str, Enum):
    """Whose fault a failure most likely is; each kind has its own restart budget
    (FATAL: none — the same run would fail the same way)."""

    USER = "user"
    INFRA = "infra"
    FATAL = "fatal"


BUDGETS: dict[Kind, FailureKind] = {
    Kind.USER: FailureKind.USER,  # a rank's own exception, or a code it exited with
    Kind.CRASH: FailureKind.USER,  # SIGSEGV, SIGABRT …: the process crashed itself
    Kind.OOM: FailureKind.USER,  # MemoryError: the job asks for more than there is
    Kind.KILLED: FailureKind.INFRA,  # SIGKILL, SIGTERM …: the OOM killer, preemption, kill
    Kind.HANG: FailureKind.INFRA,  # no progress within the timeout
    Kind.COLLATERAL: FailureKind.INFRA,  # a collective broke: a peer or the network died
    Kind.AGENT: FailureKind.INFRA,  # torchrun or the agent failed, or could not start
    Kind.AGENT_LOST: FailureKind.INFRA,  # the host agent or its connection is gone
    Kind.CONTROLLER: FailureKind.INFRA,  # the controller died (a resumed run)
    Kind.SPEC: FailureKind.FATAL,  # the planned command, env or directory cannot start
    Kind.DISK_FULL: FailureKind.FATAL,  # the run cannot write its records or checkpoints
    Kind.RECORDS: FailureKind.FATAL,  # its directory was deleted, its store fails
    Kind.CHECKPOINT: FailureKind.FATAL,  # no checkpoint loads, or it is another run's
    Kind.HOSTS_LOST: FailureKind.FATAL,  # the wait for lost hosts is over
    Kind.ALLOCATION: FailureKind.FATAL,  # the Slurm job is over: no node left to run on
    Kind.REQUEUED: FailureKind.INFRA,  # it ended early: a new one is asked for
}
"""The budget each kind of failure spends (FATAL: none — the same run would fail the
same way). Restarting a USER failure usually fails the same way, which is why its
budget defaults to zero."""


def classify(cause: Failure) -> FailureKind:
    """The budget ``cause`` spends, by its kind (:data:`BUDGETS`)."""
    return BUDGETS[cause.kind]


NO_CHECKPOINT = "no checkpoint: block in the job, so a restart starts from step 0"
"""Said when a run that may restart cannot resume (at launch, and at each restart)."""


def budget(spec: RestartSpec, kind: FailureKind) -> int:
    """The number of restarts ``spec`` allows for failures of ``kind`` (FATAL: none)."""
    if kind is FailureKind.FATAL:
        return 0
    return spec.max_user_restarts if kind is FailureKind.USER else spec.max_infra_restarts


def backoff(spec: RestartSpec, attempt: int) -> float:
    """Seconds to wait before restarting after attempt ``attempt`` (0-based) failed:
    ``backoff_initial * backoff_factor ** attempt``, at most ``backoff_max``."""
    try:
        delay = spec.backoff_initial * spec.backoff_factor ** max(0, attempt)
    except OverflowError:
        return spec.backoff_max
    return min(delay, spec.backoff_max)


class Action(str, Enum):
    """What the supervisor must do after a transition."""

    NONE = "none"
    RESTART_NOW = "restart_now"  # start attempt ``state.attempt`` now
    GIVE_UP = "give_up"  # out of budget: tear down and report ``state.last_cause``
    STOP = "stop"  # stop every host; never restart


@dataclass(frozen=True)
class RestartState:
    """The restart machine's state. The default value is the state before attempt 0.

    ``phase`` is one of STARTING, RUNNING, RESTARTING, SUCCEEDED, FAILED, STOPPED (see
    the module docstring). ``next_start_at`` is set only while RESTARTING;
    ``last_cause`` is the failure that caused the latest restart or the final FAILED.
    """

    phase: Phase = Phase.STARTING
    attempt: int = 0
    user_restarts_used: int = 0
    infra_restarts_used: int = 0
    next_start_at: float | None = None
    last_cause: Failure | None = None

    @property
    def restarts(self) -> int:
        """Restarts granted so far, both kinds together."""
        return self.user_restarts_used + self.infra_restarts_used


@dataclass(frozen=True)
class Started:
    """The attempt's host agents were started."""


@dataclass(frozen=True)
class Succeeded:
    """The attempt ended without a failure (every rank exited 0)."""


@dataclass(frozen=True)
class Failed:
    """The attempt failed, or could not be started; ``cause`` is its root cause."""

    cause: Failure


@dataclass(frozen=True)
class Tick:
    """Time passed (the ``now`` given to :func:`step`); due restarts fire on it."""


Signal = Started | Succeeded | Failed | StopRequested | Tick
"""What the supervisor observed. ``StopRequested`` is the run's own event
(:class:`dmlctl.runs.events.StopRequested`): its reason and time are not read here."""


def step(
    state: RestartState, signal: Signal, now: float, spec: RestartSpec
) -> tuple[RestartState, Action]:
    """One transition of the machine in the module docstring, under the budgets and
    backoff of ``spec``.

    Pure and total: ``state`` is not changed and every (phase, signal) pair has an
    answer. A failure spends the budget of its :func:`classify` kind only.
    """
    phase = state.phase
    if phase.terminal:
        return state, Action.NONE
    if isinstance(signal, StopRequested):
        stopped = dataclasses.replace(state, phase=Phase.STOPPED, next_start_at=None)
        return stopped, Action.STOP
    if phase is Phase.RESTARTING:
        due = state.next_start_at is None or now >= state.next_start_at
        if isinstance(signal, Tick) and due:
            restarted = dataclasses.replace(
                state, phase=Phase.STARTING, attempt=state.attempt + 1, next_start_at=None
            )
            return restarted, Action.RESTART_NOW
        return state, Action.NONE
    # STARTING or RUNNING
    if isinstance(signal, Started):
        return dataclasses.replace(state, phase=Phase.RUNNING), Action.NONE
    if isinstance(signal, Succeeded):
        return dataclasses.replace(state, phase=Phase.SUCCEEDED), Action.NONE
    if isinstance(signal, Failed):
        return _on_failure(state, signal.cause, now, spec)
    return state, Action.NONE


def _on_failure(
    state: RestartState, cause: Failure, now: float, spec: RestartSpec
) -> tuple[RestartState, Action]:
    kind = classify(cause)
    used = state.user_restarts_used if kind is FailureKind.USER else state.infra_restarts_used
    if kind is FailureKind.FATAL or used >= budget(spec, kind):
        failed = dataclasses.replace(state, phase=Phase.FAILED, last_cause=cause)
        return failed, Action.GIVE_UP
    user, infra = state.user_restarts_used, state.infra_restarts_used
    restarting = dataclasses.replace(
        state,
        phase=Phase.RESTARTING,
        user_restarts_used=user + 1 if kind is FailureKind.USER else user,
        infra_restarts_used=infra + 1 if kind is FailureKind.INFRA else infra,
        next_start_at=now + backoff(spec, state.attempt),
        last_cause=cause,
    )
    return restarting, Action.NONE


def respawned(state: RestartState, count: int) -> RestartState:
    """``state`` after ``count`` ranks were started again in place during the attempt
    (``restart.mode: in_place``): each spent one infra restart, as a full restart
    after a rank killed by a signal would have."""
    used = state.infra_restarts_used + max(0, count)
    return dataclasses.replace(state, infra_restarts_used=used)


def over_budget(state: RunState, spec: RestartSpec) -> list[RankExited]:
    """The end of the attempt when ranks replaced in place have spent more than
    ``max_infra_restarts`` (with the run's earlier restarts): the last replacement's
    cause as that rank's failed exit; nothing while within the budget."""
    infra = [f for f in state.failures if classify(f) is FailureKind.INFRA]
    if not state.respawns or len(infra) <= spec.max_infra_restarts or state.root_cause:
        return []
    last = infra[-1]
    return [RankExited(last.host, last.rank if last.rank is not None else 0, -9, last, last.ts)]


def resumed(failures: Sequence[Failure], attempt: int) -> RestartState:
    """The state in which a resumed run (``dmlctl launch --resume``) starts attempt
    ``attempt``, after the restarts caused by ``failures`` (oldest first): STARTING,
    with the budget each of those restarts spent still spent. A resume itself spends
    nothing: its cause is ``ControllerLost`` (:data:`CONTROLLER_LOST`) or FATAL (a full
    disk), neither of which the policy granted."""
    kinds = [classify(c) for c in failures if c.kind is not Kind.CONTROLLER]
    return RestartState(
        attempt=attempt,
        user_restarts_used=kinds.count(FailureKind.USER),
        infra_restarts_used=kinds.count(FailureKind.INFRA),
    )
