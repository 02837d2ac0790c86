"""dmlctl.launch.policy: the restart state machine driven by scripted signals (no
processes), and the ``restart:`` / ``checkpoint:`` spec models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from dmlctl.failure import named
from dmlctl.launch.policy import (
    Action,
    Failed,
    FailureKind,
    RestartState,
    Signal,
    Started,
    Succeeded,
    Tick,
    backoff,
    budget,
    classify,
    step,
)
from dmlctl.runs.events import StopRequested
from dmlctl.runs.state import Phase
from dmlctl.spec.field_docs import field_docs
from dmlctl.spec.restart import CheckpointSpec, RestartSpec

USER = Failed(named("a", 1, "ValueError", "bad batch"))
INFRA = Failed(named("a", 1, "Signal", "killed by SIGKILL"))
FAR = 1e9  # a tick far enough in the future that any backoff is due


def run(
    signals: Sequence[tuple[float, Signal]], policy: RestartSpec | None = None
) -> tuple[RestartState, list[Action]]:
    """Feed ``(now, signal)`` pairs from the initial state; the last state and every action."""
    state, actions = RestartState(), []
    for now, signal in signals:
        state, action = step(state, signal, now, policy or RestartSpec())
        actions.append(action)
    return state, actions


def attempt(failure: Failed, now: float = 0.0) -> list[tuple[float, Signal]]:
    """One attempt that starts, fails, and (when a restart is granted) restarts."""
    return [(now, Started()), (now, failure), (now + FAR, Tick())]


@pytest.mark.parametrize(
    ("exc_type", "rank", "kind"),
    [
        ("ValueError", 1, FailureKind.USER),
        ("ExitCode", 1, FailureKind.USER),
        ("SystemExit", 1, FailureKind.USER),
        ("RuntimeError", 0, FailureKind.USER),
        ("Signal", 1, FailureKind.INFRA),
        ("AgentLost", None, FailureKind.INFRA),
        ("AgentExit", None, FailureKind.INFRA),
        ("Hang", 3, FailureKind.INFRA),
        ("DistNetworkError", 2, FailureKind.INFRA),  # collateral: a peer or the network died
        ("OSError", None, FailureKind.INFRA),  # the agent could not be started on the host
    ],
)
def test_classify(exc_type: str, rank: int | None, kind: FailureKind) -> None:
    assert classify(named("a", rank, exc_type, "msg")) is kind


def test_success_on_first_try() -> None:
    state, actions = run([(0, Started()), (5, Tick()), (9, Succeeded())])
    assert state.phase is Phase.SUCCEEDED
    assert (state.attempt, state.restarts) == (0, 0)
    assert actions == [Action.NONE] * 3


def test_user_failures_restart_within_budget_then_give_up() -> None:
    policy = RestartSpec(max_user_restarts=2)
    state, actions = run(attempt(USER) * 3, policy)
    assert actions.count(Action.RESTART_NOW) == 2
    assert actions[-2:] == [Action.GIVE_UP, Action.NONE]
    assert state.phase is Phase.FAILED
    assert (state.attempt, state.user_restarts_used, state.infra_restarts_used) == (2, 2, 0)
    assert state.last_cause == USER.cause


def test_infra_failures_do_not_spend_the_user_budget() -> None:
    policy = RestartSpec(max_user_restarts=0, max_infra_restarts=2)
    state, actions = run(attempt(INFRA) + attempt(INFRA) + attempt(USER), policy)
    assert actions.count(Action.RESTART_NOW) == 2
    assert Action.GIVE_UP in actions
    assert state.phase is Phase.FAILED
    assert (state.infra_restarts_used, state.user_restarts_used) == (2, 0)
    assert state.last_cause == USER.cause


def test_user_failures_do_not_spend_the_infra_budget() -> None:
    policy = RestartSpec(max_user_restarts=1, max_infra_restarts=1)
    state, actions = run(
        attempt(USER) + attempt(INFRA) + [(0, Started()), (1, Succeeded())], policy
    )
    assert actions.count(Action.RESTART_NOW) == 2
    assert state.phase is Phase.SUCCEEDED
    assert (state.user_restarts_used, state.infra_restarts_used, state.attempt) == (1, 1, 2)


@pytest.mark.parametrize(
    ("policy", "delays"),
    [
        (RestartSpec(max_infra_restarts=7), [1, 2, 4, 8, 16, 30, 30]),
        (
            RestartSpec(max_infra_restarts=3, backoff_initial=0.5, backoff_factor=3),
            [0.5, 1.5, 4.5],
        ),
        (RestartSpec(max_infra_restarts=3, backoff_factor=1), [1, 1, 1]),
    ],
)
def test_backoff_grows_is_capped_and_restart_waits_for_it(
    policy: RestartSpec, delays: list[float]
) -> None:
    state, now = RestartState(), 100.0
    for expected in delays:
        state, _ = step(state, Started(), now, policy)
        state, action = step(state, INFRA, now, policy)
        assert (state.phase, action) == (Phase.RESTARTING, Action.NONE)
        assert state.next_start_at == pytest.approx(now + expected)
        state, action = step(state, Tick(), now + expected * 0.99, policy)
        assert (state.phase, action) == (Phase.RESTARTING, Action.NONE)
        now += expected
        state, action = step(state, Tick(), now, policy)
        assert (state.phase, action) == (Phase.STARTING, Action.RESTART_NOW)
        assert state.next_start_at is None
    assert state.attempt == len(delays)
    assert backoff(policy, 10_000) <= policy.backoff_max  # no float overflow


STOP_FROM = {
    "starting": [],
    "running": [(0.0, Started())],
    "restarting": [(0.0, Started()), (1.0, INFRA)],
}


@pytest.mark.parametrize("before", STOP_FROM.values(), ids=STOP_FROM.keys())
def test_stop_in_any_live_phase_never_restarts(before: list[tuple[float, Signal]]) -> None:
    policy = RestartSpec(max_infra_restarts=3)
    state, actions = run([*before, (1.5, StopRequested("user", 0.0)), (FAR, Tick())], policy)
    assert actions[-2:] == [Action.STOP, Action.NONE]
    assert (state.phase, state.next_start_at, state.attempt) == (Phase.STOPPED, None, 0)


def test_later_failures_of_a_failed_attempt_spend_nothing() -> None:
    """Several ranks of one attempt report failures: one restart is spent, not three."""
    policy = RestartSpec(max_infra_restarts=1)
    other = Failed(named("b", 3, "AgentLost", "gone"))
    state, actions = run(
        [(0, Started()), (1, INFRA), (1, other), (1, USER), (1, Succeeded())], policy
    )
    assert state.phase is Phase.RESTARTING
    assert (state.infra_restarts_used, state.user_restarts_used) == (1, 0)
    assert state.last_cause == INFRA.cause
    assert actions == [Action.NONE] * 5


def test_failure_while_starting_spends_budget() -> None:
    state, _ = run([(0, INFRA)])
    assert (state.phase, state.infra_restarts_used) == (Phase.RESTARTING, 1)


TERMINAL = {
    "succeeded": [(0.0, Started()), (1.0, Succeeded())],
    "failed": [(0.0, Started()), (1.0, USER)],
    "stopped": [(0.0, StopRequested("user", 0.0))],
}


@pytest.mark.parametrize("history", TERMINAL.values(), ids=TERMINAL.keys())
@pytest.mark.parametrize(
    "signal", [Started(), Succeeded(), USER, INFRA, StopRequested("user", 0.0), Tick()]
)
def test_terminal_states_absorb_signals(
    history: list[tuple[float, Signal]], signal: Signal
) -> None:
    final, _ = run(history)
    assert final.phase.terminal
    assert step(final, signal, FAR, RestartSpec(max_user_restarts=5)) == (final, Action.NONE)


RANGE_ERRORS: list[tuple[str, Any]] = [
    ("max_user_restarts", -1),
    ("max_infra_restarts", -2),
    ("backoff_initial", 0),
    ("backoff_factor", 0.9),
    ("backoff_max", -1),
    ("hang_timeout", 0),
]


@pytest.mark.parametrize(("field", "value"), RANGE_ERRORS)
def test_policy_rejects_what_the_spec_rejects(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        RestartSpec(**{field: value})


# --- spec models -----------------------------------------------------------------------


def test_restart_spec_defaults_and_values_build_the_policy() -> None:
    assert (budget(RestartSpec(), FailureKind.USER), budget(RestartSpec(), FailureKind.INFRA)) == (
        0,
        3,
    )
    spec = RestartSpec.model_validate({"max_user_restarts": 2, "backoff_factor": 1})
    assert (spec.max_user_restarts, spec.backoff_factor, spec.hang_timeout) == (2, 1.0, 30.0)
    assert budget(spec, FailureKind.USER) == 2
    for model in (RestartSpec, CheckpointSpec):
        assert field_docs(model).keys() == model.model_fields.keys()


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [
        *((RestartSpec, field, value) for field, value in RANGE_ERRORS),
        (RestartSpec, "max_infra_restarts", 1.5),
        (RestartSpec, "backoff_max", float("inf")),
        (RestartSpec, "hang_timeout", float("nan")),
        (RestartSpec, "max_restarts", 3),  # unknown key
        (CheckpointSpec, "every_steps", 0),
        (CheckpointSpec, "every_seconds", 0),
        (CheckpointSpec, "every_seconds", -5.0),
        (CheckpointSpec, "keep", 0),
        (CheckpointSpec, "every", 10),  # unknown key
    ],
)
def test_spec_rejects(model: type[BaseModel], field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        model.model_validate({field: value})
    assert [e["loc"] for e in info.value.errors()] == [(field,)]


def test_restart_spec_reports_every_error_and_is_frozen() -> None:
    with pytest.raises(ValidationError) as info:
        RestartSpec.model_validate({"max_user_restarts": -1, "backoff_factor": 0, "x": 1})
    assert len(info.value.errors()) == 3
    spec = RestartSpec()
    with pytest.raises(ValidationError):
        spec.max_user_restarts = 4


def test_checkpoint_spec_defaults_and_values() -> None:
    assert CheckpointSpec() == CheckpointSpec(every_steps=None, every_seconds=None, keep=3)
    spec = CheckpointSpec.model_validate({"every_steps": 500, "every_seconds": 600, "keep": 1})
    assert (spec.every_steps, spec.every_seconds, spec.keep) == (500, 600.0, 1)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("killed by SIGSEGV", FailureKind.USER),
        ("killed by SIGABRT", FailureKind.USER),
        ("killed by SIGKILL", FailureKind.INFRA),
        ("killed by SIGTERM", FailureKind.INFRA),
    ],
)
def test_a_crash_signal_is_the_codes_fault_a_kill_is_not(message: str, kind: FailureKind) -> None:
    assert classify(named("h", 1, "Signal", message)) == kind
