"""dmlctl.runs.state.apply: the pure reducer, driven by hand-built events (no processes)."""

from __future__ import annotations

import copy
import json

from dmlctl.errors import ExitCode
from dmlctl.failure import Evidence, Failure, named
from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    Event,
    Finished,
    LogLines,
    MetricRecord,
    Prepared,
    Progress,
    RankExited,
    RankStarted,
    StopRequested,
    Stream,
)
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import TAIL_LINES, Phase, RankStatus, RunState, new_run_state

T0 = 1000.0


def two_hosts() -> RunState:
    """Ranks 0, 1 on host a; ranks 2, 3 on host b."""
    ranks = [(0, "a", "worker"), (1, "a", "worker"), (2, "b", "worker"), (3, "b", "worker")]
    return new_run_state("run-1", "job", "ssgd", ranks, created_at=T0)


def started(state: RunState) -> RunState:
    events: list[Event] = [Progress("starting host agents on a, b", T0)]
    for host in ("a", "b"):
        events.append(AgentStarted(host, 100, T0 + 1))
    for rank, host, local in ((0, "a", 0), (1, "a", 1), (2, "b", 0), (3, "b", 1)):
        events.append(RankStarted(host, rank, local, "worker", 200 + rank, T0 + 2))
    return apply(state, events)


def statuses(state: RunState) -> dict[int, RankStatus]:
    return {r.rank: r.status for r in state.ranks}


def test_new_state_is_pending_with_planned_ranks() -> None:
    state = two_hosts()
    assert state.phase == Phase.PENDING
    assert state.hosts == ("a", "b")
    assert state.world_size == 4
    assert set(statuses(state).values()) == {RankStatus.PENDING}


def test_phases_advance_pending_starting_running() -> None:
    state = two_hosts()
    state = apply(state, [Progress("starting", T0)])
    assert (state.phase, state.detail) == (Phase.STARTING, "starting")
    state = apply(state, [RankStarted("a", 0, 0, "worker", 77, T0 + 5)])
    assert state.phase == Phase.RUNNING
    assert state.detail == ""
    assert state.started_at == T0 + 5
    rank0 = state.ranks[0]
    assert (rank0.status, rank0.pid, rank0.local_rank) == (RankStatus.RUNNING, 77, 0)


def test_all_ranks_succeed() -> None:
    state = started(two_hosts())
    state = apply(
        state,
        [RankExited(h, r, 0, None, T0 + 10) for r, h in ((0, "a"), (1, "a"), (2, "b"), (3, "b"))]
        + [AgentExited("a", 0, (), T0 + 11), AgentExited("b", 0, (), T0 + 11)],
    )
    assert state.phase == Phase.RUNNING  # nothing is final before Finished
    state = apply(state, [Finished(T0 + 12)])
    assert state.phase == Phase.SUCCEEDED
    assert state.exit_code == int(ExitCode.OK) == 0
    assert state.root_cause is None
    assert state.ended_at == T0 + 12
    assert set(statuses(state).values()) == {RankStatus.SUCCEEDED}
    assert state.elapsed(now=T0 + 999) == 12.0  # frozen once ended


def test_rank_failure_with_cause_is_the_root_cause() -> None:
    cause = named("a", 1, "ValueError", "bad batch", ("Traceback ...", "ValueError: bad"))
    state = started(two_hosts())
    state = apply(state, [RankExited("a", 1, 1, cause, T0 + 10)])
    assert state.root_cause == cause
    assert state.root_cause.headline() == "rank 1 on a: ValueError: bad batch"
    assert statuses(state)[1] == RankStatus.FAILED
    # torchrun tears the host's other ranks down; the agent reports its own exit.
    state = apply(state, [AgentExited("a", 1, ("torchrun failed",), T0 + 11)])
    assert statuses(state) == {
        0: RankStatus.STOPPED,
        1: RankStatus.FAILED,
        2: RankStatus.RUNNING,
        3: RankStatus.RUNNING,
    }
    assert state.root_cause == cause  # the agent's exit does not replace it
    state = apply(state, [AgentExited("b", -15, (), T0 + 12), Finished(T0 + 13)])
    assert state.phase == Phase.FAILED
    assert state.exit_code == int(ExitCode.RUN_FAILED)
    assert state.root_cause == cause
    assert statuses(state)[2] == statuses(state)[3] == RankStatus.STOPPED


def test_first_failure_wins() -> None:
    first = named("b", 2, "RuntimeError", "NCCL timeout")
    second = named("a", 0, "RuntimeError", "peer gone")
    state = apply(
        started(two_hosts()),
        [RankExited("b", 2, 1, first, T0 + 10), RankExited("a", 0, 1, second, T0 + 11)],
    )
    assert state.root_cause == first


def test_failure_without_cause_reports_exit_code() -> None:
    state = apply(started(two_hosts()), [RankExited("b", 3, 7, None, T0 + 10)])
    assert state.root_cause == named(
        "b", 3, "ExitCode", "exited with code 7", (), T0 + 10, evidence=Evidence.EXIT
    )
    assert statuses(state)[3] == RankStatus.FAILED
    assert state.ranks[3].exit_code == 7


def test_agent_exit_with_signal_cause_from_torchrun_summary() -> None:
    # What the parser makes of torchrun's failure summary for a SIGKILLed rank.
    cause = named("a", 1, "Signal", "killed by SIGKILL", ("exitcode  : -9",))
    state = apply(started(two_hosts()), [AgentExited("a", 1, ("x",), T0 + 10, cause)])
    assert state.root_cause == cause
    # The blamed rank fails, its neighbour on the host was only stopped.
    assert statuses(state)[1] == RankStatus.FAILED
    assert statuses(state)[0] == RankStatus.STOPPED


def test_agent_exit_nonzero_without_rank_cause_blames_the_host() -> None:
    tail = ("RuntimeError: rendezvous timed out",)
    state = apply(started(two_hosts()), [AgentExited("b", 1, tail, T0 + 10)])
    cause = state.root_cause
    assert cause is not None
    assert (cause.host, cause.rank, cause.exc_type) == ("b", None, "AgentExit")
    assert "code 1" in cause.message
    assert cause.traceback == tail
    assert cause.headline().startswith("host agent on b:")
    # Every running rank of the blamed host failed with it; host a is untouched.
    assert statuses(state) == {
        0: RankStatus.RUNNING,
        1: RankStatus.RUNNING,
        2: RankStatus.FAILED,
        3: RankStatus.FAILED,
    }
    state = apply(state, [Finished(T0 + 11)])
    assert (state.phase, state.exit_code) == (Phase.FAILED, 1)


def test_stop_request_ends_stopped_with_130_and_no_root_cause() -> None:
    state = apply(started(two_hosts()), [StopRequested("interrupted (Ctrl-C)", T0 + 10)])
    assert state.phase == Phase.STOPPING
    assert state.stop_reason == "interrupted (Ctrl-C)"
    # Ranks killed by the stop exit non-zero without a cause: stopped, not failed.
    state = apply(
        state,
        [
            RankExited("a", 0, -15, None, T0 + 11),
            AgentExited("a", -15, (), T0 + 11),
            AgentExited("b", 1, ("SignalException",), T0 + 11),
            Finished(T0 + 12),
        ],
    )
    assert state.phase == Phase.STOPPED
    assert state.exit_code == int(ExitCode.INTERRUPTED) == 130
    assert state.root_cause is None
    assert set(statuses(state).values()) == {RankStatus.STOPPED}


def test_a_stop_is_a_stop_when_every_rank_saves_and_exits_0() -> None:
    """The preemption pattern: each rank's SIGTERM handler saves and exits 0."""
    state = apply(started(two_hosts()), [StopRequested("stopped (dmlctl stop)", T0 + 10)])
    state = apply(
        state,
        [RankExited(h, r, 0, None, T0 + 11) for r, h in ((0, "a"), (1, "a"), (2, "b"), (3, "b"))]
        + [AgentExited("a", 0, (), T0 + 11), AgentExited("b", 0, (), T0 + 11), Finished(T0 + 12)],
    )
    assert (state.phase, state.exit_code) == (Phase.STOPPED, 130)
    assert set(statuses(state).values()) == {RankStatus.STOPPED}


def test_a_successful_run_without_ctx_prepare_shows_strategy_none() -> None:
    exits: list[Event] = [
        RankExited(h, r, 0, None, T0 + 9) for r, h in ((0, "a"), (1, "a"), (2, "b"), (3, "b"))
    ]
    plain = apply(started(two_hosts()), [*exits, Finished(T0 + 10)])
    assert (plain.phase, plain.strategy, plain.prepared) == (Phase.SUCCEEDED, "none", False)
    prepared = apply(
        started(two_hosts()), [Prepared("a", 0, "ssgd", T0 + 3), *exits, Finished(T0 + 10)]
    )
    assert (prepared.strategy, prepared.prepared) == ("ssgd", True)
    assert RunState.from_dict(json.loads(json.dumps(prepared.to_dict()))).prepared is True


def test_stop_after_a_rank_failed_is_a_failure() -> None:
    cause = named("a", 0, "ZeroDivisionError", "division by zero")
    state = apply(started(two_hosts()), [RankExited("a", 0, 1, cause, T0 + 10)])
    state = apply(state, [StopRequested("stopped (dmlctl stop)", T0 + 11), Finished(T0 + 12)])
    assert state.phase == Phase.FAILED
    assert state.exit_code == 1
    assert state.root_cause == cause


def test_stop_after_the_run_ended_changes_nothing() -> None:
    done = apply(
        started(two_hosts()),
        [RankExited("a", r, 0, None, T0) for r in (0, 1)]
        + [RankExited("b", r, 0, None, T0) for r in (2, 3)]
        + [Finished(T0 + 1)],
    )
    after = apply(done, [StopRequested("late", T0 + 2)])
    assert after.phase == Phase.SUCCEEDED
    assert after.stop_reason is None


def test_metrics_update_step_loss_and_throughput() -> None:
    state = started(two_hosts())
    state = apply(
        state,
        [
            MetricRecord("a", 0, 1, {"loss": 2.5, "samples_per_s": 100}, T0 + 3),
            MetricRecord("a", 0, 2, {"loss": 2.0, "lr": 0.1}, T0 + 4),
            MetricRecord("b", 2, 7, {"loss": "nan?", "samples_per_s": True}, T0 + 4),
        ],
    )
    r0, r2 = state.ranks[0], state.ranks[2]
    assert (r0.step, r0.loss, r0.samples_per_s) == (2, 2.0, 100.0)
    assert dict(r0.metrics) == {"loss": 2.0, "samples_per_s": 100, "lr": 0.1}
    # Non-numeric values (and bools) are kept in metrics but not taken as loss/throughput.
    assert (r2.step, r2.loss, r2.samples_per_s) == (7, None, None)
    assert r2.metrics["loss"] == "nan?"


def test_log_lines_count_per_rank_and_feed_the_tail() -> None:
    state = apply(
        started(two_hosts()),
        [
            LogLines("a", 0, Stream.STDOUT, ("epoch 1",), T0),
            LogLines("a", 0, Stream.STDERR, ("warning",), T0),
            LogLines("b", None, Stream.AGENT, ("torchrun says hi",), T0),
            # torchrun's report of a failed worker: the log files only (the recorder)
            LogLines("b", None, Stream.TORCHRUN, ("Root Cause (first observed failure):",), T0),
        ],
    )
    assert (state.ranks[0].lines, state.ranks[0].last_line) == (2, "warning")
    assert [t.text for t in state.tail] == ["epoch 1", "warning", "torchrun says hi"]
    assert state.tail[-1].rank is None and state.tail[-1].stream == Stream.AGENT


def test_tail_is_bounded_and_keeps_the_newest_lines() -> None:
    state = started(two_hosts())
    n = TAIL_LINES * 3 + 7
    lines = [LogLines("a", 1, Stream.STDOUT, (f"line {i}",), T0) for i in range(n)]
    state = apply(state, lines[: n // 2])
    state = apply(state, lines[n // 2 :])
    assert len(state.tail) == TAIL_LINES
    assert state.tail[0].text == f"line {n - TAIL_LINES}"
    assert state.tail[-1].text == f"line {n - 1}"
    assert state.ranks[1].lines == n  # counting is not bounded


def test_apply_does_not_mutate_its_input() -> None:
    before = started(two_hosts())
    snapshot = copy.deepcopy(before)
    as_dict = before.to_dict()
    after = apply(
        before,
        [
            LogLines("a", 0, Stream.STDOUT, ("x",), T0),
            MetricRecord("a", 0, 3, {"loss": 1.0}, T0),
            RankExited("a", 1, 1, named("a", 1, "E", "m"), T0),
            StopRequested("why", T0),
            AgentExited("a", 1, (), T0),
            Finished(T0 + 1),
        ],
    )
    assert before == snapshot
    assert before.to_dict() == as_dict
    assert before.phase == Phase.RUNNING and before.tail == ()
    assert after is not before and after.phase == Phase.FAILED


def test_unplanned_rank_is_added() -> None:
    state = apply(two_hosts(), [RankStarted("b", 9, 0, "worker", 1, T0)])
    assert [r.rank for r in state.ranks] == [0, 1, 2, 3, 9]
    assert state.ranks[-1].host == "b"


def test_state_round_trips_through_json() -> None:
    cause = named("a", 1, "ValueError", "bad", ("Traceback", "ValueError: bad"))
    state = apply(
        started(two_hosts()),
        [
            LogLines("a", 0, Stream.STDERR, ("oops",), T0),
            LogLines("b", None, Stream.AGENT, ("agent",), T0),
            MetricRecord("a", 0, 3, {"loss": 1.5, "tag": "x", "ok": True, "none": None}, T0),
            RankExited("a", 1, 1, cause, T0),
            StopRequested("stopped (dmlctl stop)", T0),
            Finished(T0 + 1),
        ],
    )
    data = json.loads(json.dumps(state.to_dict()))
    assert data["phase"] == "failed"
    assert data["ranks"][1]["status"] == "failed"
    again = RunState.from_dict(data)
    assert again == state
    assert isinstance(again.root_cause, Failure)
    assert again.root_cause.traceback == cause.traceback
    assert again.tail[0].stream is Stream.STDERR


def test_pending_state_round_trips_through_json() -> None:
    state = two_hosts()
    assert RunState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_a_ranks_own_error_beats_a_collateral_one_that_arrived_first() -> None:
    peer_died = named(
        "a",
        0,
        "RuntimeError",
        "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4996",
        (),
        T0 + 10.2,
    )
    real = named("a", 1, "RuntimeError", "loss is NaN at step 3", (), T0 + 10.0)
    later = named("b", 2, "ValueError", "another own error, but later", (), T0 + 12)
    state = apply(
        started(two_hosts()),
        [
            RankExited("a", 0, 1, peer_died, T0 + 10.2),
            RankExited("a", 1, 1, real, T0 + 10.0),
            RankExited("b", 2, 1, later, T0 + 12),
        ],
    )
    assert peer_died.collateral and not real.collateral
    assert state.root_cause == real


def test_the_root_cause_does_not_depend_on_the_order_the_failures_arrived_in() -> None:
    """Two hosts: rank 1 on a is SIGKILLed (only torchrun's summary says so), its peers
    break in their collectives; b's torchrun names its own rank 2 first. Whatever
    order the agents' and ranks' reports come in, rank 1 is the root cause."""
    exit_only = {"evidence": Evidence.EXIT}
    summary_b = named("b", 2, "ExitCode", "exited with code 1", (), T0 + 11, **exit_only)
    killed = named("a", 1, "Signal", "killed by SIGKILL", (), T0 + 11, **exit_only)
    gloo = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer"
    peer_b = named("b", 2, "RuntimeError", gloo, (), T0 + 10.4)
    peer_a = named("a", 0, "RuntimeError", gloo, (), T0 + 10.2)
    events: list[Event] = [
        AgentExited("b", 1, (), T0 + 11, summary_b),
        AgentExited("a", 1, (), T0 + 11, killed),
        RankExited("b", 2, 1, peer_b, T0 + 10.4),
        RankExited("a", 0, 1, peer_a, T0 + 10.2),
    ]
    for order in (events, events[::-1], [events[2], events[0], events[3], events[1]]):
        state = apply(started(two_hosts()), order)
        assert state.root_cause == killed, order
        assert len(state.seen) == 4


def test_a_host_stopped_after_a_failure_does_not_become_the_root_cause() -> None:
    """After rank 0's collective broke (a peer's fault), host b's agent is killed by the
    stop rules: its exit, with no cause, says nothing the known failure did not."""
    gloo = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer"
    peer = named("a", 0, "RuntimeError", gloo, (), T0 + 10)
    state = apply(
        started(two_hosts()),
        [RankExited("a", 0, 1, peer, T0 + 10), AgentExited("b", -9, (), T0 + 12)],
    )
    assert state.root_cause == peer
    alone = apply(started(two_hosts()), [AgentExited("b", 1, ("x",), T0 + 12)])
    assert alone.root_cause is not None and alone.root_cause.exc_type == "AgentExit"


def test_earliest_failure_wins_between_own_errors() -> None:
    early = named("b", 2, "ValueError", "first", (), T0 + 5)
    late = named("a", 0, "KeyError", "second", (), T0 + 6)
    state = apply(
        started(two_hosts()),
        [RankExited("a", 0, 1, late, T0 + 6), RankExited("b", 2, 1, early, T0 + 5)],
    )
    assert state.root_cause == early
