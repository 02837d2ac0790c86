"""The real supervisor loop driven through the restart policy's actions: scripted host
agents (no processes) fail, the supervisor feeds the policy, and the runs restart, give
up or stop exactly as the policy says, with real time for the backoff."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from dmlctl.agent_config import AgentConfig
from dmlctl.failure import CONTROLLER, Failure, named
from dmlctl.launch.policy import (
    CONTROLLER_LOST,
    Action,
    Failed,
    FailureKind,
    RestartState,
    Started,
    backoff,
    classify,
    resumed,
    step,
)
from dmlctl.launch.supervisor import Supervisor
from dmlctl.protocol import ENV_ATTEMPT
from dmlctl.runs.events import Event, Progress, Restarting, StopRequested
from dmlctl.runs.state import Phase, RunState, new_run_state
from dmlctl.runs.store import RunDir, RunStore
from dmlctl.spec.restart import RestartSpec
from dmlctl.transport.fake import ScriptedTransport, agent_lines, rank_error
from tests.unit.test_supervisor import RUN_ID, RecordingSink, make_plan

BACKOFF = 0.05  # seconds: small, but long enough to be measured

USER_ERROR = rank_error("ValueError", "bad batch")
INFRA_ERROR = rank_error("Signal", "killed by SIGKILL")


def _failing(error: dict[str, object]) -> list[str]:
    """An attempt whose rank 0 fails with ``error``."""
    return agent_lines([0], host="a", errors={0: error})


OK = agent_lines([0], host="a")


class TimedSink(RecordingSink):
    """Also keeps when (monotonic) each event was shown."""

    def __init__(self, stop_on: type | None = None) -> None:
        super().__init__(self._seen)
        self.seen: list[tuple[float, Event]] = []
        self.sup: Supervisor | None = None
        self._stop_on = stop_on

    def _seen(self, ev: Event) -> None:
        self.seen.append((time.monotonic(), ev))
        if self._stop_on is not None and isinstance(ev, self._stop_on) and self.sup is not None:
            self.sup.request_stop("stopped (dmlctl stop)")

    def restarts(self) -> list[Restarting]:
        return [ev for ev in self.events if isinstance(ev, Restarting)]


def _supervise(
    tmp_path: Path,
    attempts: Sequence[list[str]],
    restart: RestartSpec,
    sink: TimedSink | None = None,
    resume_from: RunState | None = None,
) -> tuple[RunState, ScriptedTransport, TimedSink]:
    """Run a one-host plan whose agent replays ``attempts`` (the last one repeats)."""
    run: RunDir = RunStore(tmp_path / "home").create(RUN_ID)
    t = ScriptedTransport("a", attempts[0], later=list(attempts[1:]))
    sink = sink or TimedSink()
    sup = Supervisor(
        make_plan(tmp_path, [1]),
        run,
        {"a": t},
        sink,
        restart=restart,
        fail_grace=0.1,
        stop_grace=0.0,
        stop_margin=0.5,
    )
    sink.sup = sup
    return sup.run(resume_from), t, sink


def _attempt_of(t: ScriptedTransport, n: int) -> str:
    """The ``DMLCTL_ATTEMPT`` (1-based) the ``n``-th started agent was given."""
    return AgentConfig.from_json(t.processes[n].sent[0]).rank_env()[ENV_ATTEMPT]


def test_a_failure_with_budget_left_restarts_after_the_policys_backoff(tmp_path: Path) -> None:
    restart = RestartSpec(max_user_restarts=1, backoff_initial=BACKOFF)
    state, t, sink = _supervise(tmp_path, [_failing(USER_ERROR), OK], restart)
    assert state.phase is Phase.SUCCEEDED and state.exit_code == 0
    assert len(t.processes) == 2 and state.restarts == 1
    [announced] = sink.restarts()
    assert (announced.attempt, announced.cause.exc_type) == (1, "ValueError")
    assert announced.delay == backoff(restart, 0) == BACKOFF
    at = next(ts for ts, ev in sink.seen if isinstance(ev, Restarting))
    started = next(
        ts for ts, ev in sink.seen if isinstance(ev, Progress) and "attempt 2" in ev.text
    )
    assert started - at >= BACKOFF * 0.9  # the wait is the policy's, in real time
    assert _attempt_of(t, 1) == "2"


def test_the_backoff_grows_with_each_restart(tmp_path: Path) -> None:
    restart = RestartSpec(max_infra_restarts=2, backoff_initial=BACKOFF, backoff_factor=2)
    state, t, sink = _supervise(tmp_path, [_failing(INFRA_ERROR)], restart)
    assert [r.delay for r in sink.restarts()] == [BACKOFF, 2 * BACKOFF]
    assert [r.attempt for r in sink.restarts()] == [1, 2]
    assert state.phase is Phase.FAILED and len(t.processes) == 3


def test_a_failure_without_budget_gives_up_with_its_root_cause(tmp_path: Path) -> None:
    restart = RestartSpec(max_user_restarts=0, max_infra_restarts=3, backoff_initial=BACKOFF)
    state, t, sink = _supervise(tmp_path, [_failing(USER_ERROR), OK], restart)
    assert len(t.processes) == 1 and sink.restarts() == []
    assert state.phase is Phase.FAILED and state.exit_code == 1 and state.restarts == 0
    assert state.root_cause is not None
    assert (state.root_cause.exc_type, state.root_cause.message) == ("ValueError", "bad batch")
    assert state.failures == ()


def test_a_stop_during_the_backoff_stops_without_restarting(tmp_path: Path) -> None:
    restart = RestartSpec(max_user_restarts=3, backoff_initial=5.0)
    started = time.monotonic()
    state, t, sink = _supervise(
        tmp_path, [_failing(USER_ERROR), OK], restart, TimedSink(stop_on=Restarting)
    )
    assert time.monotonic() - started < 4.0  # the wait was cut short
    assert len(t.processes) == 1 and len(sink.restarts()) == 1
    assert state.phase is Phase.STOPPED and state.exit_code == 130
    assert state.stop_reason == "stopped (dmlctl stop)"
    assert any(isinstance(ev, StopRequested) for ev in sink.events)


def test_user_and_infra_failures_spend_their_own_budgets(tmp_path: Path) -> None:
    """infra (restart 1 of 1), user (restart 1 of 1), infra again: out of infra budget."""
    restart = RestartSpec(max_user_restarts=1, max_infra_restarts=1, backoff_initial=BACKOFF)
    attempts = [_failing(INFRA_ERROR), _failing(USER_ERROR), _failing(INFRA_ERROR), OK]
    state, t, sink = _supervise(tmp_path, attempts, restart)
    assert [r.cause.exc_type for r in sink.restarts()] == ["Signal", "ValueError"]
    assert len(t.processes) == 3 and state.restarts == 2
    assert state.phase is Phase.FAILED
    assert state.root_cause is not None and state.root_cause.exc_type == "Signal"


def test_infra_failures_do_not_spend_the_user_budget(tmp_path: Path) -> None:
    restart = RestartSpec(max_user_restarts=0, max_infra_restarts=2, backoff_initial=BACKOFF)
    attempts = [_failing(INFRA_ERROR), _failing(INFRA_ERROR), OK]
    state, t, _ = _supervise(tmp_path, attempts, restart)
    assert state.phase is Phase.SUCCEEDED and state.restarts == 2 and len(t.processes) == 3


def _lost_run(failures: tuple[Failure, ...]) -> RunState:
    """The last state of a run whose controller died after ``failures`` restarts."""
    state = new_run_state(RUN_ID, "job", "ssgd", [(0, "a", "worker")], time.time())
    return dataclasses.replace(
        state, phase=Phase.LOST, restarts=len(failures), failures=failures, started_at=1.0
    )


USER_CAUSE = named("a", 0, "ValueError", "bad batch")
INFRA_CAUSE = named("a", 0, "Signal", "killed by SIGKILL")
RESUME_CAUSE = named(CONTROLLER, None, CONTROLLER_LOST, "the controller died")


def test_a_resumed_run_keeps_the_budgets_it_spent(tmp_path: Path) -> None:
    """One user restart was spent before the controller died: the user failure of the
    resumed attempt finds no budget left (a fresh run with this policy would restart)."""
    restart = RestartSpec(max_user_restarts=1, backoff_initial=BACKOFF)
    lost = _lost_run((USER_CAUSE,))
    state, t, sink = _supervise(tmp_path, [_failing(USER_ERROR), OK], restart, resume_from=lost)
    assert len(t.processes) == 1
    assert _attempt_of(t, 0) == "3"  # resumed as attempt restarts + 1 (0-based: 2)
    assert [r.cause.exc_type for r in sink.restarts()] == [CONTROLLER_LOST]  # the resume
    assert state.phase is Phase.FAILED and state.restarts == 2
    assert state.root_cause is not None and state.root_cause.exc_type == "ValueError"


def test_a_resume_itself_spends_no_budget(tmp_path: Path) -> None:
    """Two earlier resumes and one infra restart: one infra restart is still left."""
    restart = RestartSpec(max_infra_restarts=2, backoff_initial=BACKOFF, backoff_factor=1.5)
    lost = _lost_run((RESUME_CAUSE, INFRA_CAUSE, RESUME_CAUSE))
    attempts = [_failing(INFRA_ERROR), OK]
    state, t, sink = _supervise(tmp_path, attempts, restart, resume_from=lost)
    assert len(t.processes) == 2 and state.phase is Phase.SUCCEEDED
    assert [r.attempt for r in sink.restarts()] == [4, 5]  # the resume, then the restart
    assert sink.restarts()[1].delay == backoff(restart, 4)  # the backoff goes on growing
    assert state.restarts == 5 and len(state.failures) == 5


def test_resumed_seeds_the_budgets_of_earlier_restarts() -> None:
    fatal = named(CONTROLLER, None, "DiskFull", "no space")
    seeded = resumed((USER_CAUSE, RESUME_CAUSE, INFRA_CAUSE, fatal, INFRA_CAUSE), attempt=6)
    assert seeded == RestartState(
        phase=Phase.STARTING, attempt=6, user_restarts_used=1, infra_restarts_used=2
    )
    spec = RestartSpec(max_user_restarts=1, max_infra_restarts=3)
    running, _ = step(seeded, Started(), 0.0, spec)
    assert step(running, Failed(USER_CAUSE), 0.0, spec)[1] is Action.GIVE_UP
    restarting, action = step(running, Failed(INFRA_CAUSE), 10.0, spec)
    assert (restarting.phase, action, restarting.infra_restarts_used) == (
        Phase.RESTARTING,
        Action.NONE,
        3,
    )
    assert restarting.next_start_at == 10.0 + backoff(spec, 6)


@pytest.mark.parametrize("exc_type", ["HostsLost", "DiskFull"])
def test_a_failure_before_an_attempt_is_never_restarted(exc_type: str) -> None:
    """Too few hosts after the wait for them, a full disk at the start: FATAL."""
    cause = named("a", None, exc_type, "x")
    assert classify(cause) is FailureKind.FATAL
    state, action = step(RestartState(), Failed(cause), 0.0, RestartSpec(max_infra_restarts=9))
    assert (state.phase, action, state.restarts) == (Phase.FAILED, Action.GIVE_UP, 0)
