"""Restart policy: a pure state machine that decides whether a failed run starts again.

Nothing here does I/O or reads a clock: the supervisor passes ``now`` in, feeds the
signals it observed and carries out the returned :class:`Action`. Tests script the
signals (no processes), like the torch elastic agent's tests script its monitor.

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

Budgets: a failure spends one restart of its :class:`FailureKind` only. USER failures
(the training code's own fault) default to no restart; INFRA failures (signals, lost
hosts, hangs) default to three. The wait before a restart grows geometrically with the
number of restarts so far and is capped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from dmlctl.runs.events import RootCause
from dmlctl.runs.state import RunState

_INFRA_TYPES = frozenset({"Signal", "AgentLost", "AgentExit", "Hang"})
FATAL_TYPES = frozenset(
    {"SpecInvalid", "DiskFull", "RunDirGone", "StoreError", "CheckpointCorrupt"}
)
"""Root causes a restart cannot cure (see :func:`classify`)."""


class FailureKind(str, Enum):
    """Whose fault a failure most likely is; each kind has its own restart budget
    (FATAL: none — the same run would fail the same way)."""

    USER = "user"
    INFRA = "infra"
    FATAL = "fatal"


def classify(cause: RootCause) -> FailureKind:
    """The kind of a root cause, from its ``exc_type`` (and rank):

    ===========================================  =====  ==========================
    cause                                        kind   why
    ===========================================  =====  ==========================
    ``Signal``: SIGKILL, SIGTERM, SIGHUP, …       INFRA  killed from outside (OOM
                                                        killer, preemption, kill)
    ``Signal``: SIGSEGV, SIGABRT, SIGBUS,        USER   the process crashed itself
    SIGFPE, SIGILL, SIGTRAP, SIGSYS                     (native code, an abort())
    ``AgentLost``                                INFRA  host agent / connection gone
    ``AgentExit``                                INFRA  torchrun or the agent failed
    ``Hang``                                     INFRA  no progress within the timeout
    collateral error (``RootCause.collateral``)  INFRA  a collective broke because a
                                                        peer or the network died
    any type with ``rank is None``               INFRA  the host side failed (e.g. the
                                                        agent could not be started)
    ``ExitCode``                                 USER   a rank exited non-zero itself
    any other type (``ValueError``,              USER   a rank's own Python exception
    ``SystemExit``, ``RuntimeError`` …)
    ``SpecInvalid``: the agent cannot start      FATAL  the run's own spec (its
    torchrun with the planned command, env or           argv, env, directory) is
    directory                                           at fault: never restarted,
                                                        no budget spent
    ``DiskFull``, ``RunDirGone``,                FATAL  the run cannot keep its
    ``StoreError``                                      records (a full disk, its
                                                        directory deleted)
    ``CheckpointCorrupt``                        FATAL  no checkpoint can be loaded
    ===========================================  =====  ==========================

    Restarting a USER failure usually fails the same way, which is why its budget
    defaults to zero.
    """
    if cause.exc_type in FATAL_TYPES:
        return FailureKind.FATAL
    if cause.exc_type == "Signal" and any(sig in cause.message for sig in _CRASH_SIGNALS):
        return FailureKind.USER
    if cause.exc_type in _INFRA_TYPES or cause.collateral or cause.rank is None:
        return FailureKind.INFRA
    return FailureKind.USER


# Signals a process raises against itself when it crashes: its own fault, not the
# infrastructure's, so restarting it spends the user-code budget.
_CRASH_SIGNALS = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS")


@dataclass(frozen=True)
class RestartPolicy:
    """How many restarts each failure kind may use and how long to wait before each.

    Constructible from a job file's ``restart:`` block: ``RestartPolicy(**mapping)``
    (see :class:`dmlctl.spec.restart.RestartSpec`, which validates the same keys).
    ``hang_timeout`` (the hang detector), ``stop_grace`` and the ``host_*`` settings
    (lost hosts, see :mod:`dmlctl.launch.hosts`) are carried for the supervisor;
    :func:`step` does not read them. Raises ``ValueError`` for values the spec model would reject.
    """

    max_user_restarts: int = 0
    max_infra_restarts: int = 3
    backoff_initial: float = 1.0
    backoff_factor: float = 2.0
    backoff_max: float = 30.0
    hang_timeout: float = 30.0
    stop_grace: float = 30.0
    host_timeout: float = 10.0
    host_wait: float = 60.0
    host_cooldown: float = 30.0
    standby: bool = True

    def __post_init__(self) -> None:
        for name, ok, rule in (
            ("max_user_restarts", self.max_user_restarts >= 0, ">= 0"),
            ("max_infra_restarts", self.max_infra_restarts >= 0, ">= 0"),
            ("backoff_initial", self.backoff_initial > 0, "> 0"),
            ("backoff_factor", self.backoff_factor >= 1, ">= 1"),
            ("backoff_max", self.backoff_max > 0, "> 0"),
            ("hang_timeout", self.hang_timeout > 0, "> 0"),
            ("stop_grace", self.stop_grace >= 0, ">= 0"),
            ("host_timeout", self.host_timeout > 0, "> 0"),
            ("host_wait", self.host_wait >= 0, ">= 0"),
            ("host_cooldown", self.host_cooldown >= 0, ">= 0"),
        ):
            if not ok:
                raise ValueError(
                    f"restart policy: {name} must be {rule}, got {getattr(self, name)!r}"
                )

    def budget(self, kind: FailureKind) -> int:
        """The number of restarts allowed for failures of ``kind`` (FATAL: none)."""
        if kind is FailureKind.FATAL:
            return 0
        return self.max_user_restarts if kind is FailureKind.USER else self.max_infra_restarts

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before restarting after attempt ``attempt`` (0-based) failed:
        ``backoff_initial * backoff_factor ** attempt``, at most ``backoff_max``."""
        try:
            delay = self.backoff_initial * self.backoff_factor ** max(0, attempt)
        except OverflowError:
            return self.backoff_max
        return min(delay, self.backoff_max)


class RestartPhase(str, Enum):
    """Where the run is in its start → run → restart cycle."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def terminal(self) -> bool:
        """True for the phases that absorb every further signal."""
        return self in (RestartPhase.SUCCEEDED, RestartPhase.FAILED, RestartPhase.STOPPED)


class Action(str, Enum):
    """What the supervisor must do after a transition."""

    NONE = "none"
    RESTART_NOW = "restart_now"  # start attempt ``state.attempt`` now
    GIVE_UP = "give_up"  # out of budget: tear down and report ``state.last_cause``
    STOP = "stop"  # stop every host; never restart


@dataclass(frozen=True)
class RestartState:
    """The restart machine's state. The default value is the state before attempt 0.

    ``next_start_at`` is set only while RESTARTING; ``last_cause`` is the failure that
    caused the latest restart or the final FAILED.
    """

    phase: RestartPhase = RestartPhase.STARTING
    attempt: int = 0
    user_restarts_used: int = 0
    infra_restarts_used: int = 0
    next_start_at: float | None = None
    last_cause: RootCause | None = None

    @property
    def restarts(self) -> int:
        """Restarts granted so far, both kinds together."""
        return self.user_restarts_used + self.infra_restarts_used


@dataclass(frozen=True)
class Started:
    """The attempt's workers are up (rendezvous done / first rank started)."""


@dataclass(frozen=True)
class Succeeded:
    """Every rank of the attempt exited 0."""


@dataclass(frozen=True)
class Failed:
    """The attempt failed; ``cause`` is its root cause."""

    cause: RootCause


@dataclass(frozen=True)
class StopRequested:
    """The user asked to stop (not the events' ``StopRequested``: no reason needed here)."""


@dataclass(frozen=True)
class Tick:
    """Time passed (the ``now`` given to :func:`step`); due restarts fire on it."""


Signal = Started | Succeeded | Failed | StopRequested | Tick


def step(
    state: RestartState, signal: Signal, now: float, policy: RestartPolicy
) -> tuple[RestartState, Action]:
    """One transition of the machine in the module docstring.

    Pure and total: ``state`` is not changed and every (phase, signal) pair has an
    answer. A failure spends the budget of its :func:`classify` kind only.
    """
    phase = state.phase
    if phase.terminal:
        return state, Action.NONE
    if isinstance(signal, StopRequested):
        stopped = dataclasses.replace(state, phase=RestartPhase.STOPPED, next_start_at=None)
        return stopped, Action.STOP
    if phase is RestartPhase.RESTARTING:
        due = state.next_start_at is None or now >= state.next_start_at
        if isinstance(signal, Tick) and due:
            restarted = dataclasses.replace(
                state, phase=RestartPhase.STARTING, attempt=state.attempt + 1, next_start_at=None
            )
            return restarted, Action.RESTART_NOW
        return state, Action.NONE
    # STARTING or RUNNING
    if isinstance(signal, Started):
        return dataclasses.replace(state, phase=RestartPhase.RUNNING), Action.NONE
    if isinstance(signal, Succeeded):
        return dataclasses.replace(state, phase=RestartPhase.SUCCEEDED), Action.NONE
    if isinstance(signal, Failed):
        return _on_failure(state, signal.cause, now, policy)
    return state, Action.NONE


def _on_failure(
    state: RestartState, cause: RootCause, now: float, policy: RestartPolicy
) -> tuple[RestartState, Action]:
    kind = classify(cause)
    used = state.user_restarts_used if kind is FailureKind.USER else state.infra_restarts_used
    if kind is FailureKind.FATAL or used >= policy.budget(kind):
        failed = dataclasses.replace(state, phase=RestartPhase.FAILED, last_cause=cause)
        return failed, Action.GIVE_UP
    user, infra = state.user_restarts_used, state.infra_restarts_used
    restarting = dataclasses.replace(
        state,
        phase=RestartPhase.RESTARTING,
        user_restarts_used=user + 1 if kind is FailureKind.USER else user,
        infra_restarts_used=infra + 1 if kind is FailureKind.INFRA else infra,
        next_start_at=now + policy.backoff(state.attempt),
        last_cause=cause,
    )
    return restarting, Action.NONE


class RestartDecider:
    """The supervisor's ``decide`` callback over this state machine: given the state
    of an attempt that failed, the seconds to wait before restarting, or None to give
    up. Keeps the budgets across attempts."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.state = RestartState(phase=RestartPhase.RUNNING)

    def __call__(self, run: RunState) -> float | None:
        cause = run.root_cause
        if cause is None:
            return None
        now = 0.0  # the backoff does not depend on the time the failure happened
        self.state, action = step(self.state, Failed(cause), now, self.policy)
        if action == Action.GIVE_UP or self.state.phase != RestartPhase.RESTARTING:
            return None
        delay = (self.state.next_start_at or now) - now
        self.state, _ = step(self.state, Tick(), self.state.next_start_at or now, self.policy)
        self.state, _ = step(self.state, Started(), now, self.policy)
        return max(0.0, delay)
