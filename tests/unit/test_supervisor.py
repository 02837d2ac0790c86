"""dmlctl.launch.supervisor with scripted host agents (dmlctl.transport.fake) on a real
run directory: no processes, no torch; every test ends in well under a second."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from dmlctl.agent_config import AgentConfig
from dmlctl.failure import named
from dmlctl.launch.stops import FAIL_STOP_GRACE, STREAMING_S
from dmlctl.launch.supervisor import Supervisor
from dmlctl.plan.build import build_plan
from dmlctl.plan.model import LaunchPlan
from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    Event,
    Progress,
    RankExited,
    RankStarted,
)
from dmlctl.runs.parser import parse_line
from dmlctl.runs.state import Phase, RankStatus, RunState, phase_exit_code
from dmlctl.runs.store import RunDir, RunStore
from dmlctl.spec import ClusterSpec, HostSpec, JobSpec
from dmlctl.transport.fake import (
    STOP,
    ScriptedProcess,
    ScriptedTransport,
    agent_lines,
    agent_log,
    agent_started,
    rank_error,
    rank_log,
    rank_start,
)

RUN_ID = "run-1"


class RecordingSink:
    """Keeps what the supervisor shows; ``on_event`` runs for every event (in the
    supervisor's thread), which lets a test act at a precise point of the run."""

    def __init__(self, on_event: Callable[[Event], None] | None = None) -> None:
        self.batches: list[tuple[list[Event], RunState]] = []
        self.ticks = 0
        self.closed: RunState | None = None
        self._on_event = on_event

    def on_events(self, events: Sequence[Event], state: RunState) -> None:
        self.batches.append((list(events), state))
        if self._on_event is not None:
            for ev in events:
                self._on_event(ev)

    def tick(self) -> None:
        self.ticks += 1

    def close(self, state: RunState) -> None:
        self.closed = state

    @property
    def events(self) -> list[Event]:
        return [ev for batch, _ in self.batches for ev in batch]


def make_plan(
    tmp_path: Path, slots: Sequence[int], env: dict[str, str] | None = None
) -> LaunchPlan:
    """Local hosts a, b, … with ``slots`` workers each."""
    names = "abcdefgh"
    cluster = ClusterSpec(
        hosts=[HostSpec(name=names[i], address="localhost", slots=n) for i, n in enumerate(slots)]
    )
    job = JobSpec(name="job", script="train.py", workdir=str(tmp_path), env=env or {})
    return build_plan(
        cluster,
        job,
        run_id=RUN_ID,
        rdzv_port=29500,
        local_python="/usr/bin/python3",
        local_run_dir=str(tmp_path / "home" / "runs" / RUN_ID),
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    return RunStore(tmp_path / "home").create(RUN_ID)


def supervise(
    plan: LaunchPlan,
    run: RunDir,
    transports: dict[str, ScriptedTransport],
    sink: RecordingSink | None = None,
    *,
    fail_grace: float = 0.2,
    stop_grace: float = 0.0,
    stop_margin: float = 1.0,
) -> tuple[Supervisor, RunState, float]:
    """Run the plan to its end; returns the supervisor, final state and seconds taken."""
    sup = Supervisor(
        plan,
        run,
        transports,
        sink or RecordingSink(),
        fail_grace=fail_grace,
        stop_grace=stop_grace,
        stop_margin=stop_margin,
    )
    t0 = time.monotonic()
    state = sup.run()
    return sup, state, time.monotonic() - t0


def commands(proc: ScriptedProcess) -> list[str]:
    """The first word of every line sent to ``proc`` after its configuration."""
    return [line.split()[0] for line in proc.sent[1:]]


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_successful_two_rank_run(tmp_path: Path, run_dir: RunDir) -> None:
    plan = make_plan(tmp_path, [2])
    lines = agent_lines(
        [0, 1],
        host="a",
        logs={0: ["hello from 0", "epoch 1 done"], 1: ["hello from 1"]},
        metrics={
            0: [(1, {"loss": 2.0, "samples_per_s": 50.0}), (2, {"loss": 1.5})],
            1: [(1, {"loss": 2.1})],
        },
        tail=["torchrun finished"],
    )
    a = ScriptedTransport("a", lines)
    sink = RecordingSink()
    _, state, took = supervise(plan, run_dir, {"a": a}, sink)

    assert state.phase == Phase.SUCCEEDED
    assert state.exit_code == 0 == phase_exit_code(state)
    assert state.root_cause is None
    assert [r.status for r in state.ranks] == [RankStatus.SUCCEEDED] * 2
    assert (state.ranks[0].step, state.ranks[0].loss) == (2, 1.5)
    assert took < 2.0

    logs = run_dir.logs
    assert read_lines(logs / "rank-0.log") == ["hello from 0", "epoch 1 done"]
    assert read_lines(logs / "rank-1.log") == ["hello from 1"]
    merged = read_lines(logs / "merged.log")
    assert merged == ["[rank 0] hello from 0", "[rank 0] epoch 1 done", "[rank 1] hello from 1"]
    metrics = [json.loads(x) for x in read_lines(run_dir.metrics)]
    assert [(m["rank"], m["step"], m["host"]) for m in metrics] == [
        (0, 1, "a"),
        (0, 2, "a"),
        (1, 1, "a"),
    ]
    assert metrics[0]["values"] == {"loss": 2.0, "samples_per_s": 50.0}

    on_disk = RunState.from_dict(json.loads(run_dir.state_file.read_text()))
    assert on_disk == state
    summary = RunState.from_dict(json.loads(run_dir.summary.read_text()))
    assert summary.phase == Phase.SUCCEEDED and summary.ended_at is not None
    assert sink.closed == state
    assert any(isinstance(ev, RankStarted) for ev in sink.events)
    # The agent is done with: it never needed a stop.
    assert a.process.sent[1:] == []


def test_agent_gets_its_config_on_stdin_not_on_the_command_line(
    tmp_path: Path, run_dir: RunDir
) -> None:
    secret = "tok-9f8e7d"
    plan = make_plan(tmp_path, [2], env={"API_TOKEN": secret, "LR": "0.1"})
    host = plan.hosts[0]
    a = ScriptedTransport("a", agent_lines([0, 1], host="a"))
    supervise(plan, run_dir, {"a": a})

    proc = a.process
    assert proc.argv == host.agent_argv
    assert not any(secret in arg for arg in proc.argv)
    config = AgentConfig.from_json(proc.sent[0])  # the first line sent
    assert config == plan.agent_config(host, stop_grace=0.0)
    assert config.torchrun.argv() == host.torchrun_argv
    assert config.rank_env() == {
        **host.env,
        "DMLCTL_ATTEMPT": "1",
        "DMLCTL_RANK_DIR": host.rank_dir,
        "DMLCTL_STRATEGY": "ssgd",
        "DMLCTL_STRATEGY_PARAMS": "{}",
    }
    assert config.env["API_TOKEN"] == secret
    assert (config.run_id, config.host, config.torchrun.nproc) == (RUN_ID, "a", 2)


@pytest.mark.parametrize(("stop_grace", "grace"), [(30.0, FAIL_STOP_GRACE), (0.5, 0.5)])
def test_failing_rank_stops_the_other_host_after_fail_grace(
    tmp_path: Path, run_dir: RunDir, stop_grace: float, grace: float
) -> None:
    """The other host's ranks get a short grace (it failed): the job's stop_grace, at
    most FAIL_STOP_GRACE."""
    plan = make_plan(tmp_path, [1, 1])  # rank 0 on a, rank 1 on b
    error = rank_error("ValueError", "bad batch")
    a = ScriptedTransport(
        "a",
        agent_lines([0], host="a", logs={0: ["about to fail"]}, errors={0: error}),
    )
    b = ScriptedTransport("b", [agent_started(), rank_start(1, 0, host="b")], hang=True)
    sink = RecordingSink()
    _, state, took = supervise(
        plan, run_dir, {"a": a, "b": b}, sink, fail_grace=0.2, stop_grace=stop_grace
    )

    assert b.process.sent[1:] == [f"{STOP} {grace:g}"]
    assert not b.process.killed
    assert a.process.sent[1:] == []  # a had already ended
    assert state.phase == Phase.FAILED
    assert phase_exit_code(state) == 1
    assert state.root_cause is not None
    assert dataclasses.replace(state.root_cause, ts=0.0) == named(
        "a", 0, "ValueError", "bad batch", tuple(error["traceback"])
    )
    assert {r.rank: r.status for r in state.ranks} == {
        0: RankStatus.FAILED,
        1: RankStatus.STOPPED,
    }
    assert 0.2 <= took < 2.0
    assert read_lines(run_dir.rank_log(0)) == ["about to fail"]
    summary = json.loads(run_dir.summary.read_text())
    assert summary["root_cause"]["exc_type"] == "ValueError"


def test_request_stop_while_running(tmp_path: Path, run_dir: RunDir) -> None:
    plan = make_plan(tmp_path, [2])
    a = ScriptedTransport(
        "a",
        [agent_started(), rank_start(0, host="a"), rank_start(1, host="a"), rank_log(0, "step 1")],
        hang=True,
    )
    holder: list[Supervisor] = []

    def stop_once_running(ev: Event) -> None:
        if isinstance(ev, RankStarted) and ev.rank == 1:
            holder[0].request_stop("interrupted (Ctrl-C)")

    sink = RecordingSink(stop_once_running)
    sup = Supervisor(plan, run_dir, {"a": a}, sink, fail_grace=0.2, stop_grace=0.5, stop_margin=1.0)
    holder.append(sup)
    t0 = time.monotonic()
    state = sup.run()

    assert time.monotonic() - t0 < 2.0
    assert a.process.sent[1:] == [f"{STOP} 0.5"]  # the ranks get the job's stop_grace
    assert not a.process.killed  # the agent answered the stop in time
    assert state.phase == Phase.STOPPED
    assert state.exit_code == 130 == phase_exit_code(state)
    assert state.stop_reason == "interrupted (Ctrl-C)"
    assert state.root_cause is None
    assert {r.status for r in state.ranks} == {RankStatus.STOPPED}
    assert json.loads(run_dir.state_file.read_text())["phase"] == "stopped"


def test_agent_that_ignores_stop_is_killed_after_stop_timeout(
    tmp_path: Path, run_dir: RunDir
) -> None:
    plan = make_plan(tmp_path, [1])
    a = ScriptedTransport(
        "a", [agent_started(), rank_start(0, host="a")], hang=True, ignore_stop=True
    )
    sup = Supervisor(plan, run_dir, {"a": a}, RecordingSink(), stop_grace=0.0, stop_margin=0.3)
    sup.request_stop("stopped (dmlctl stop)")
    t0 = time.monotonic()
    state = sup.run()
    took = time.monotonic() - t0

    assert commands(a.process) == [STOP]
    assert a.process.killed
    assert 0.3 <= took < STREAMING_S + 1.5  # not while its last output is this recent
    # Killed while stopping: still a stop, not a failure.
    assert (state.phase, state.exit_code, state.root_cause) == (Phase.STOPPED, 130, None)


def test_agent_whose_stdin_is_closed_is_killed_at_once(tmp_path: Path, run_dir: RunDir) -> None:
    plan = make_plan(tmp_path, [1])
    a = ScriptedTransport("a", [agent_started(), rank_start(0, host="a")], hang=True)
    holder: list[Supervisor] = []

    def lose_stdin_then_stop(ev: Event) -> None:
        if isinstance(ev, RankStarted):
            a.process.close_stdin()
            holder[0].request_stop("interrupted (Ctrl-C)")

    sup = Supervisor(
        plan,
        run_dir,
        {"a": a},
        RecordingSink(lose_stdin_then_stop),
        stop_grace=0.0,
        stop_margin=5.0,
    )
    holder.append(sup)
    t0 = time.monotonic()
    state = sup.run()
    assert time.monotonic() - t0 < 2.0  # did not wait for stop_timeout
    assert a.process.killed
    assert a.process.sent[1:] == []
    assert state.phase == Phase.STOPPED


def test_second_stop_request_kills_without_waiting(tmp_path: Path, run_dir: RunDir) -> None:
    plan = make_plan(tmp_path, [1])
    a = ScriptedTransport(
        "a", [agent_started(), rank_start(0, host="a")], hang=True, ignore_stop=True
    )
    holder: list[Supervisor] = []

    def double_stop(ev: Event) -> None:
        if isinstance(ev, RankStarted):
            holder[0].request_stop("interrupted (Ctrl-C)")
            holder[0].request_stop("interrupted again")

    sup = Supervisor(
        plan, run_dir, {"a": a}, RecordingSink(double_stop), stop_grace=0.0, stop_margin=5.0
    )
    holder.append(sup)
    t0 = time.monotonic()
    state = sup.run()
    assert time.monotonic() - t0 < 2.0  # not the 5 s stop timeout
    assert commands(a.process) == [STOP]
    assert a.process.killed
    assert (state.phase, state.exit_code) == (Phase.STOPPED, 130)
    assert state.stop_reason == "interrupted (Ctrl-C)"  # the first reason is kept


def test_agent_output_ending_without_exit_message_is_agent_lost(
    tmp_path: Path, run_dir: RunDir
) -> None:
    plan = make_plan(tmp_path, [1])
    lines = agent_lines([0], host="a", exits={0: None}, agent_code=None)
    a = ScriptedTransport(
        "a", lines, exit_code=255, stderr=["ssh: connection reset", "Broken pipe"]
    )
    _, state, took = supervise(plan, run_dir, {"a": a})

    cause = state.root_cause
    assert cause is not None
    assert (cause.host, cause.rank, cause.exc_type) == ("a", None, "AgentLost")
    assert "exit code 255" in cause.message
    assert cause.traceback == ("ssh: connection reset", "Broken pipe")
    assert state.phase == Phase.FAILED
    assert state.ranks[0].status == RankStatus.FAILED
    assert took < 2.0


def test_agent_that_cannot_start_is_the_root_cause(tmp_path: Path, run_dir: RunDir) -> None:
    plan = make_plan(tmp_path, [1, 1])
    a = ScriptedTransport("a", start_error=OSError("no route to host"))
    b = ScriptedTransport("b", [agent_started(), rank_start(1, 0, host="b")], hang=True)
    _, state, took = supervise(plan, run_dir, {"a": a, "b": b}, fail_grace=0.1)

    assert a.processes == []
    assert commands(b.process) == [STOP]
    cause = state.root_cause
    assert cause is not None
    assert (cause.host, cause.rank, cause.exc_type) == ("a", None, "OSError")
    assert "no route to host" in cause.message
    assert state.phase == Phase.FAILED
    assert took < 2.0


def test_stray_agent_output_lands_in_the_agent_log(tmp_path: Path, run_dir: RunDir) -> None:
    plan = make_plan(tmp_path, [1])
    lines = agent_lines([0], host="a")
    lines[1:1] = [
        "Warning: Permanently added 'a' to the list of known hosts.",
        agent_log("W1120 torchrun: OMP_NUM_THREADS set"),
    ]
    a = ScriptedTransport("a", lines)
    _, state, _ = supervise(plan, run_dir, {"a": a})
    assert state.phase == Phase.SUCCEEDED
    assert read_lines(run_dir.logs / "agent-a.log") == [
        "Warning: Permanently added 'a' to the list of known hosts.",
        "W1120 torchrun: OMP_NUM_THREADS set",
    ]
    assert "[a] W1120 torchrun: OMP_NUM_THREADS set" in read_lines(run_dir.logs / "merged.log")


# --------------------------------------------------------------- the fake itself


def test_agent_lines_parse_into_a_consistent_session() -> None:
    lines = agent_lines([2, 3], host="b", errors={3: rank_error("OSError", "disk full")})
    events = [ev for line in lines for ev in parse_line("b", line, 0.0)]
    assert isinstance(events[0], AgentStarted)
    assert [(e.rank, e.local_rank) for e in events if isinstance(e, RankStarted)] == [
        (2, 0),
        (3, 1),
    ]
    exits = {e.rank: e for e in events if isinstance(e, RankExited)}
    assert (exits[2].exit_code, exits[2].cause) == (0, None)
    assert exits[3].exit_code == 1
    assert exits[3].cause is not None and exits[3].cause.message == "disk full"
    last = events[-1]
    assert isinstance(last, AgentExited) and last.exit_code == 1


def test_scripted_run_always_returns_a_result() -> None:
    t = ScriptedTransport("a", results={("true",): (0, "ok\n", "")})
    ok = t.run(["true"], timeout=1.0, input=b"data")
    missing = t.run(["nope", "--x"], timeout=1.0)
    assert (ok.ok, ok.stdout, ok.host, ok.argv) == (True, "ok\n", "a", ("true",))
    assert (missing.exit_code, missing.ok) == (127, False)
    assert "not scripted" in missing.stderr
    assert [r["argv"] for r in t.runs] == [("true",), ("nope", "--x")]
    assert t.runs[0]["input"] == b"data"


def test_scripted_process_wait_and_kill() -> None:
    proc = ScriptedTransport("a", [agent_started()], hang=True).start(["agent"])
    assert proc.send("{}") and proc.wait(0.01) is None
    it = proc.lines()
    assert next(it) == agent_started()
    proc.kill()
    assert list(it) == []  # killed: no exit message
    assert proc.wait(1.0) == -9
    assert not proc.send(STOP)


def recorded_outcomes(sup: Supervisor) -> list[object]:
    """The typed result of every attempt ``sup`` follows, in order."""
    seen: list[object] = []
    follow = sup.attempts.follow

    def recording(state: RunState, run: object) -> object:
        result = follow(state, run)  # type: ignore[arg-type]
        seen.append(result)
        return result

    sup.attempts.follow = recording  # type: ignore[method-assign,assignment]
    return seen


def test_an_attempt_ends_with_one_typed_outcome(tmp_path: Path) -> None:
    from dmlctl.launch.attempt import AttemptResult
    from dmlctl.launch.policy import Failed, Succeeded
    from dmlctl.runs.events import StopRequested

    def attempt(transports: dict[str, ScriptedTransport], name: str) -> AttemptResult:
        plan = make_plan(tmp_path / name, [1, 1])
        run = RunStore(tmp_path / name / "home").create(RUN_ID)
        holder: list[Supervisor] = []

        def stop_on_start(ev: Event) -> None:
            if name == "stopped" and isinstance(ev, RankStarted):
                holder[0].request_stop("asked")

        sup = Supervisor(plan, run, transports, RecordingSink(stop_on_start), fail_grace=0.2)
        holder.append(sup)
        seen = recorded_outcomes(sup)
        final = sup.run()
        (result,) = seen
        assert isinstance(result, AttemptResult) and final.phase.terminal
        return result

    ok = {h: ScriptedTransport(h, agent_lines([r], host=h)) for r, h in enumerate("ab")}
    assert attempt(ok, "ok").outcome == Succeeded()
    error = rank_error("ValueError", "bad batch")
    bad = {
        "a": ScriptedTransport("a", agent_lines([0], host="a", errors={0: error})),
        "b": ScriptedTransport("b", agent_lines([1], host="b")),
    }
    failed = attempt(bad, "failed")
    assert isinstance(failed.outcome, Failed)
    assert failed.outcome.cause == failed.state.root_cause and failed.outcome.cause is not None
    hang = {
        h: ScriptedTransport(h, [agent_started(), rank_start(r, host=h)], hang=True)
        for r, h in enumerate("ab")
    }
    stopped = attempt(hang, "stopped")
    assert isinstance(stopped.outcome, StopRequested) and stopped.outcome.reason == "asked"


def test_an_attempt_holds_its_store_here_while_its_agents_run(
    tmp_path: Path, run_dir: RunDir
) -> None:
    """With ``plan.store_host`` (a run replaced in place) the attempt's store listens
    on this machine while the agents run: every agent's torchrun meets there and its
    ranks are told where it is; it is closed once the attempt ended."""
    plan = dataclasses.replace(make_plan(tmp_path, [2]), store_host="127.0.0.1")
    t = ScriptedTransport("a", agent_lines([0, 1], host="a"))
    reached: list[bool] = []

    def connect_once_started(ev: Event) -> None:
        if isinstance(ev, AgentStarted):
            endpoint = AgentConfig.from_json(t.process.sent[0]).torchrun.rdzv_endpoint
            with contextlib.suppress(OSError), socket.create_connection(_split(endpoint), 2):
                reached.append(True)

    _, state, _ = supervise(plan, run_dir, {"a": t}, RecordingSink(connect_once_started))
    assert state.phase == Phase.SUCCEEDED and reached == [True]
    config = AgentConfig.from_json(t.process.sent[0])
    endpoint = config.torchrun.rdzv_endpoint
    assert endpoint.startswith("127.0.0.1:") and not config.torchrun.is_host
    assert config.env["DMLCTL_RUN_STORE"] == endpoint
    with pytest.raises(OSError):
        socket.create_connection(_split(endpoint), 2).close()


def test_a_store_address_this_machine_lacks_leaves_the_store_with_rank_0s_torchrun(
    tmp_path: Path, run_dir: RunDir
) -> None:
    """A run resumed on a machine without the planned address: said in one line, and
    the attempt runs with torchrun's own store (its planned command)."""
    plan = dataclasses.replace(make_plan(tmp_path, [1]), store_host="203.0.113.9")
    t = ScriptedTransport("a", agent_lines([0], host="a"))
    sink = RecordingSink()
    _, state, _ = supervise(plan, run_dir, {"a": t}, sink)
    assert state.phase == Phase.SUCCEEDED
    config = AgentConfig.from_json(t.process.sent[0])
    assert config.torchrun.rdzv_endpoint == plan.hosts[0].torchrun.rdzv_endpoint
    assert "DMLCTL_RUN_STORE" not in config.env
    said = [e.text for e in sink.events if isinstance(e, Progress)]
    assert any("the run's store stays with rank 0's host this attempt" in s for s in said), said


def _split(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.rsplit(":", 1)
    return host, int(port)
