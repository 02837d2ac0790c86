"""The stop rules (dmlctl.launch.stops) with recording processes: who is told to stop
with which grace, and when an agent is killed — never while it still drains output."""

from __future__ import annotations

import dataclasses

from dmlctl.failure import named
from dmlctl.launch.stops import FAIL_STOP_GRACE, STREAMING_S, AttemptStops, StopRules
from dmlctl.runs.events import RankExited, StopRequested
from dmlctl.runs.state import new_run_state
from dmlctl.transport.fake import ScriptedProcess, ScriptedTransport

STATE = new_run_state("r", "j", "ssgd", [(0, "a", "worker"), (1, "b", "worker")], 0.0)


def agents(*hosts: str) -> dict[str, ScriptedProcess]:
    """A running agent per host that records what it is sent and whether it is killed."""
    return {h: ScriptedTransport(h, [], hang=True).start(("agent",)) for h in hosts}


def rules() -> StopRules:
    return StopRules(stop_grace=30.0, fail_grace=2.0, stop_margin=5.0)


def test_a_users_stop_gives_the_ranks_the_jobs_grace_and_kills_late_agents() -> None:
    procs, stops, r = agents("a", "b"), AttemptStops(), rules()
    r.request("interrupted (Ctrl-C)")
    events = r.apply(stops, procs, {"a", "b"}, STATE, [], 100.0)
    assert events == [StopRequested("interrupted (Ctrl-C)", 100.0)]
    assert procs["a"].sent == procs["b"].sent == ["stop 30"]  # (no config was sent here)
    r.apply(stops, procs, {"a", "b"}, STATE, [], 134.9)
    assert not procs["a"].killed
    r.apply(stops, procs, {"a", "b"}, STATE, [], 135.0)
    assert procs["a"].killed and procs["b"].killed
    assert stops.killed == {"a", "b"}


def test_a_failure_stops_the_others_after_the_fail_grace_with_a_short_grace() -> None:
    procs, stops, r = agents("b"), AttemptStops(), rules()
    cause = named("a", 0, "ValueError", "x")
    r.apply(stops, procs, {"b"}, STATE, [RankExited("a", 0, 1, cause, 10.0)], 10.0)
    assert procs["b"].sent == []  # the failed host's peers may still report
    failed = dataclasses.replace(STATE, root_cause=cause)
    r.apply(stops, procs, {"b"}, failed, [], 12.0)
    assert procs["b"].sent == [f"stop {FAIL_STOP_GRACE:g}"]


def test_an_agent_still_sending_output_is_killed_only_once_it_is_quiet() -> None:
    procs, stops, r = agents("a", "b"), AttemptStops(), rules()
    r.request("stopped")
    r.apply(stops, procs, {"a", "b"}, STATE, [], 0.0)
    stops.data_at["a"] = 34.5  # a is draining its ranks' output backlog
    r.apply(stops, procs, {"a", "b"}, STATE, [], 35.0)
    assert (procs["a"].killed, procs["b"].killed) == (False, True)
    r.apply(stops, procs, {"a", "b"}, STATE, [], 34.5 + STREAMING_S)
    assert procs["a"].killed and stops.killed == {"a", "b"}


def test_a_second_request_kills_at_once_even_a_draining_agent() -> None:
    procs, stops, r = agents("a"), AttemptStops(), rules()
    r.request("interrupted")
    r.apply(stops, procs, {"a"}, STATE, [], 0.0)
    stops.data_at["a"] = 0.5
    r.request("interrupted again")
    r.apply(stops, procs, {"a"}, STATE, [], 1.0)
    assert procs["a"].killed
