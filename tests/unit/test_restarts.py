"""Restarts and hang detection in the supervisor, with scripted agents (no processes)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dmlctl import wire
from dmlctl.agent_config import AgentConfig, StrategyChoice, TorchrunCommand
from dmlctl.launch.standby import Standbys
from dmlctl.launch.supervisor import Supervisor
from dmlctl.plan.model import HostPlan
from dmlctl.protocol import ENV_ATTEMPT, ENV_RANK_DIR
from dmlctl.runs.events import Event, RankStarted, Restarting
from dmlctl.runs.state import Phase, RankStatus, RunState
from dmlctl.runs.store import RunDir, RunStore
from dmlctl.spec.restart import RestartSpec
from dmlctl.transport.base import Transport
from dmlctl.transport.fake import (
    ScriptedProcess,
    ScriptedTransport,
    agent_lines,
    agent_started,
    rank_error,
    rank_start,
)
from tests.unit.test_supervisor import RUN_ID, RecordingSink, make_plan

QUICK = 0.01  # seconds of backoff before a restart in these tests


def _run(
    tmp_path: Path,
    transports: dict[str, ScriptedTransport],
    sink: RecordingSink | None = None,
    **kw: object,
) -> RunState:
    run: RunDir = RunStore(tmp_path / "home").create(RUN_ID)
    plan = make_plan(tmp_path, [1])
    sup = Supervisor(
        plan,
        run,
        transports,
        sink or RecordingSink(),
        fail_grace=0.1,
        stop_grace=0.0,
        stop_margin=0.5,
        **kw,
    )  # type: ignore[arg-type]
    return sup.run()


def _restart_causes(sink: RecordingSink) -> list[str]:
    """The exception type of every failure the policy restarted, in order."""
    return [ev.cause.exc_type for ev in sink.events if isinstance(ev, Restarting)]


def test_a_failed_attempt_is_restarted_when_the_policy_says_so(tmp_path: Path) -> None:
    failing = agent_lines([0], host="a", errors={0: rank_error("ValueError", "flaky")})
    ok = agent_lines([0], host="a")
    t = ScriptedTransport("a", failing, later=[ok])
    sink = RecordingSink()
    restart = RestartSpec(max_user_restarts=1, backoff_initial=QUICK)
    state = _run(tmp_path, {"a": t}, sink, restart=restart)
    assert _restart_causes(sink) == ["ValueError"]
    assert len(t.processes) == 2
    assert state.phase == Phase.SUCCEEDED and state.exit_code == 0
    assert state.restarts == 1
    assert [c.message for c in state.failures] == ["flaky"]
    assert state.root_cause is None
    second = AgentConfig.from_json(t.processes[1].sent[0])
    assert second.rank_dir.endswith("/attempt-1")
    assert AgentConfig.from_json(t.processes[0].sent[0]).rank_env()[ENV_ATTEMPT] == "1"
    assert second.rank_env()[ENV_ATTEMPT] == "2"  # as the dashboard counts attempts
    argv = second.torchrun.argv()
    assert argv[argv.index("--rdzv-id") + 1] == f"{RUN_ID}.1"


def test_without_a_restart_the_run_fails_with_the_last_cause(tmp_path: Path) -> None:
    failing = agent_lines([0], host="a", errors={0: rank_error("KeyError", "again")})
    t = ScriptedTransport("a", failing)
    restart = RestartSpec(max_user_restarts=2, backoff_initial=QUICK)
    state = _run(tmp_path, {"a": t}, restart=restart)
    assert len(t.processes) == 3
    assert state.phase == Phase.FAILED and state.restarts == 2
    assert state.root_cause is not None and state.root_cause.message == "again"
    assert len(state.failures) == 2


def test_a_rank_that_stops_beating_is_hung_after_its_stacks_are_asked_for(
    tmp_path: Path,
) -> None:
    beat = json.dumps(
        {"kind": "heartbeat", "progress": 7, "rank": 0, "ts": 1.0, "where": "train.py:9 in step"}
    )
    hanging = [agent_started(), rank_start(0, 0, host="a"), wire.encode_rank_record(beat)]
    t = ScriptedTransport("a", hanging, hang=True)
    started = time.monotonic()
    state = _run(tmp_path, {"a": t}, hang_timeout=0.5, dump_wait=0.3)
    took = time.monotonic() - started
    assert state.phase == Phase.FAILED
    cause = state.root_cause
    assert cause is not None and (cause.rank, cause.exc_type) == (0, "Hang")
    assert cause.message.startswith("not responding: sent no heartbeat for ")
    assert cause.message.endswith("last seen at train.py:9 in step")
    assert state.ranks[0].status == RankStatus.FAILED
    assert [line.split()[0] for line in t.process.sent[1:]] == ["dump", "stop"]
    assert took < 5, took


def test_ranks_without_heartbeats_are_never_called_hung(tmp_path: Path) -> None:
    quiet = [agent_started(), rank_start(0, 0, host="a")]
    t = ScriptedTransport("a", quiet, hang=True)
    sup_state: dict[str, RunState] = {}

    class StopSoon(RecordingSink):
        def tick(self) -> None:
            if time.monotonic() - t0 > 1.0:
                sup.request_stop("test over")

    run = RunStore(tmp_path / "home").create(RUN_ID)
    sup = Supervisor(
        make_plan(tmp_path, [1]),
        run,
        {"a": t},
        StopSoon(),
        hang_timeout=0.2,
        stop_grace=0.0,
        stop_margin=0.5,
    )
    t0 = time.monotonic()
    sup_state["s"] = sup.run()
    assert sup_state["s"].phase == Phase.STOPPED
    assert sup_state["s"].root_cause is None


def test_attempt_config_numbers_attempts_from_one_and_separates_later_ones(
    tmp_path: Path,
) -> None:
    plan = make_plan(tmp_path, [1], env={"A": "1"})
    host = plan.hosts[0]
    first = plan.agent_config(host, 0)
    assert (first.attempt, first.rank_dir, first.torchrun.rdzv_id) == (0, host.rank_dir, RUN_ID)
    assert first.rank_env()[ENV_ATTEMPT] == "1" and first.env == host.env
    third = plan.agent_config(host, 2)
    assert third.rank_dir == f"{host.rank_dir}/attempt-2"
    assert third.torchrun.rdzv_id == f"{RUN_ID}.2"
    argv = third.torchrun.argv()
    assert argv[argv.index("--rdzv-id") + 1] == f"{RUN_ID}.2"
    env = third.rank_env()
    assert (env["A"], env[ENV_ATTEMPT], env[ENV_RANK_DIR]) == ("1", "3", third.rank_dir)
    assert third.env == host.env  # the plan's environment is left as it was


def test_agent_config_round_trips_through_its_wire_form() -> None:
    torchrun = TorchrunCommand("/py", 2, 3, "h:1", "id.1", "t.py", ("--x", "1"), False, "h")
    strategy = StrategyChoice("easgd", {"lr": 0.5})
    config = AgentConfig("id", "a", 1, "/w", "/r/attempt-1", torchrun, {"A": "1"}, strategy, 2.0)
    assert AgentConfig.from_json(config.to_json()) == config
    assert "\n" not in config.to_json()


def test_stop_during_backoff_ends_the_run_stopped(tmp_path: Path) -> None:
    failing = agent_lines([0], host="a", errors={0: rank_error("ValueError", "x")})
    t = ScriptedTransport("a", failing)
    run = RunStore(tmp_path / "home").create(RUN_ID)

    def stop_once_restarting(ev: Event) -> None:
        if isinstance(ev, Restarting):
            sup.request_stop("user")

    restart = RestartSpec(max_user_restarts=1, backoff_initial=30.0)
    sup = Supervisor(
        make_plan(tmp_path, [1]),
        run,
        {"a": t},
        RecordingSink(stop_once_restarting),
        restart=restart,
    )
    started = time.monotonic()
    state = sup.run()
    assert time.monotonic() - started < 5
    assert len(t.processes) == 1
    assert state.phase == Phase.STOPPED and state.exit_code == 130


def test_a_restart_takes_the_standby_agent_started_during_the_attempt(tmp_path: Path) -> None:
    """Once ranks run, a standby agent is started on their host; the next attempt is
    handed to it instead of a new agent, and an unused standby is closed at the end."""
    t = ScriptedTransport(
        "a",
        [agent_started(), rank_start(0, host="a")],
        hang=True,
        later=[agent_lines([0], host="a")],
    )

    def wait_for(cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 5
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.01)

    def script() -> None:
        wait_for(lambda: len(t.processes) >= 2)  # the standby is up: lose the agent
        t.processes[0].kill()
        wait_for(lambda: bool(t.processes[1].sent))  # attempt 1 went to the standby
        time.sleep(0.3)  # its lines are out; end it (scripted agents hang after them)
        t.processes[1].kill()

    scripted: list[threading.Thread] = []

    def lose_the_agent_once_a_standby_exists(ev: object) -> None:
        if isinstance(ev, RankStarted) and not scripted:
            scripted.append(threading.Thread(target=script, daemon=True))
            scripted[0].start()

    run: RunDir = RunStore(tmp_path / "home").create(RUN_ID)
    sup = Supervisor(
        make_plan(tmp_path, [1]),
        run,
        {"a": t},
        RecordingSink(lose_the_agent_once_a_standby_exists),
        fail_grace=0.1,
        stop_grace=0.0,
        stop_margin=0.5,
        restart=RestartSpec(max_infra_restarts=1, backoff_initial=QUICK),
        standby=True,
        warm_after=0.0,
    )
    state = sup.run()
    assert state.phase == Phase.SUCCEEDED and state.restarts == 1, state.failures
    standby = t.processes[1]
    assert standby.argv == tuple(make_plan(tmp_path, [1]).hosts[0].agent_argv)
    assert AgentConfig.from_json(standby.sent[0]).rank_env()[ENV_ATTEMPT] == "2"  # 2nd attempt
    assert state.failures[0].exc_type == "AgentLost"
    for extra in t.processes[2:]:  # a standby for an attempt that never came
        assert extra.sent == [] and extra.wait(0) is not None


class SlowTransport(ScriptedTransport):
    """Hanging agents; host b's start waits for ``release`` (a slow SSH connection)."""

    def __init__(self, host: str, release: threading.Event) -> None:
        super().__init__(host, hang=True)
        self.release = release

    def start(self, argv: Sequence[str], *, cwd: str | None = None) -> ScriptedProcess:
        if self.host == "b":
            self.release.wait(5)
        return super().start(argv, cwd=cwd)


def test_a_standby_that_starts_after_the_run_ended_is_stopped(tmp_path: Path) -> None:
    """The run ends while a standby is still being started (a slow SSH connection):
    ``close`` stops the ready one and, once the late one has started, that one too,
    before it returns — no agent outlives its run."""
    release = threading.Event()
    ta, tb = SlowTransport("a", release), SlowTransport("b", release)
    hosts = make_plan(tmp_path, [1, 1]).hosts
    standbys = Standbys({"a": ta, "b": tb}, warm_after=0.0)
    for host in hosts:
        standbys.warm_up(host, 1.0)
    deadline = time.monotonic() + 5
    while not ta.processes and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Timer(0.2, release.set).start()  # b's agent starts while close waits
    standbys.close(wait=3.0)
    (a,), (b,) = ta.processes, tb.processes
    for proc in (a, b):
        assert proc.stdin_closed and proc.sent == [] and proc.wait(0) is not None
    standbys.warm_up(hosts[0], 1.0)  # after close: nothing more is started
    assert len(ta.processes) == 1


def test_standbys_dropped_are_stopped_and_later_ones_start_on_the_new_transports(
    tmp_path: Path,
) -> None:
    """``drop`` (the hosts moved to new machines) stops the ready standby, and the one
    still being started once it has started; a later warm-up starts one through the
    transport now in the mapping, and that one is handed out."""
    release = threading.Event()
    ta, tb = SlowTransport("a", release), SlowTransport("b", release)
    transports: dict[str, Transport] = {"a": ta, "b": tb}
    hosts = make_plan(tmp_path, [1, 1]).hosts
    standbys = Standbys(transports, warm_after=0.0)
    for host in hosts:
        standbys.warm_up(host, 1.0)
    deadline = time.monotonic() + 5
    while not ta.processes and time.monotonic() < deadline:
        time.sleep(0.01)
    standbys.drop()  # a's standby ready or nearly, b's still being started
    release.set()

    def ended() -> bool:
        procs = ta.processes + tb.processes
        return len(procs) == 2 and all(p.wait(0) is not None for p in procs)

    while not ended() and time.monotonic() < deadline:
        time.sleep(0.01)
    for proc in ta.processes + tb.processes:
        assert proc.wait(0) is not None and proc.sent == [] and proc.stdin_closed
    assert standbys.take("a") is None and standbys.take("b") is None
    transports["a"] = new = ScriptedTransport("a", hang=True)
    standbys.warm_up(hosts[0], 1.0)
    while standbys.take("a") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(new.processes) == 1 and len(ta.processes) == 1
    standbys.close()


def test_an_attempt_whose_rendezvous_port_was_taken_meets_at_another(tmp_path: Path) -> None:
    """torchrun could not listen on the planned port (another process took it after
    the plan found it free): the agent's exit names it, and the next attempt of every
    host meets at a port the ``rendezvous`` callable gives for the first host."""
    taken = (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        "local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, "
        "message: address already in use"
    )
    exit_line = wire.encode(wire.ExitMsg(1, ("RendezvousConnectionError: …",), (taken,)))
    t = ScriptedTransport("a", [agent_started(), exit_line], later=[agent_lines([0], host="a")])
    asked: list[str] = []

    def rendezvous(host: HostPlan) -> str:
        asked.append(host.name)
        return "localhost:31337"

    restart = RestartSpec(max_infra_restarts=1, backoff_initial=QUICK)
    state = _run(tmp_path, {"a": t}, restart=restart, rendezvous=rendezvous)
    assert state.phase == Phase.SUCCEEDED and asked == ["a"]
    cause = state.failures[-1]
    assert (cause.exc_type, cause.host) == ("RendezvousPortTaken", "a")
    assert "port 29500 was taken" in cause.message
    endpoints = [AgentConfig.from_json(p.sent[0]).torchrun.rdzv_endpoint for p in t.processes]
    assert endpoints == ["localhost:29500", "localhost:31337"]
