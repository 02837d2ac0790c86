"""dmlctl.runs.parser: one agent output line in, typed events out (pure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dmlctl import wire
from dmlctl.failure import named
from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    Collective,
    Heartbeat,
    LogLines,
    MetricRecord,
    Prepared,
    ProcSample,
    ProcUsage,
    RankExited,
    RankStarted,
    StackDump,
    StacksDumped,
    Stream,
)
from dmlctl.runs.parser import parse_line, torchrun_failure
from dmlctl.transport.fake import (
    agent_exit,
    agent_log,
    agent_started,
    rank_error,
    rank_exit,
    rank_log,
    rank_metric,
    rank_start,
)

NOW = 1234.5


def one(host: str, line: str) -> object:
    events = parse_line(host, line, NOW)
    assert len(events) == 1, events
    return events[0]


def torchrun_summary(*failures: tuple[int, int, int, int], script: str = "train.py") -> list[str]:
    """torchrun's ChildFailedError summary for ``(idx, rank, exitcode, pid)`` failures;
    the first one is the root cause (torchrun prints it last)."""

    def block(idx: int, rank: int, code: int, pid: int) -> list[str]:
        trace = (
            f"Signal {-code} (SIGKILL) received by PID {pid}"
            if code < 0
            else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        )
        return [
            f"[{idx}]:",
            "  time      : 2026-11-20_22:33:27",
            "  host      : worker-7",
            f"  rank      : {rank} (local_rank: {rank})",
            f"  exitcode  : {code} (pid: {pid})",
            "  error_file: <N/A>",
            f"  traceback : {trace}",
        ]

    root, *others = failures
    other_lines = [line for f in others for line in block(*f)] or ["  <NO_OTHER_FAILURES>"]
    return [
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/site-packages/torch/distributed/run.py", line 892, in main',
        "    run(args)",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        f"{script} FAILED",
        "-" * 60,
        "Failures:",
        *other_lines,
        "-" * 60,
        "Root Cause (first observed failure):",
        *block(*root),
        "=" * 60,
    ]


def test_agent_started() -> None:
    assert one("a", agent_started(pid=321)) == AgentStarted("a", 321, NOW)


def test_rank_log_lines_of_one_message_become_one_event() -> None:
    events = parse_line("a", rank_log(3, "epoch 1", "epoch 2", stream="stderr"), NOW)
    assert events == [LogLines("a", 3, Stream.STDERR, ("epoch 1", "epoch 2"), NOW)]


def test_agent_log_line_has_no_rank() -> None:
    assert one("b", agent_log("W1120 torchrun warning")) == LogLines(
        "b", None, Stream.AGENT, ("W1120 torchrun warning",), NOW
    )


def test_rank_start_record_uses_its_own_timestamp() -> None:
    ev = one("a", rank_start(2, 0, pid=999, role="worker", ts=50.0))
    assert ev == RankStarted("a", 2, 0, "worker", 999, 50.0)


def test_metric_record() -> None:
    ev = one("a", rank_metric(1, 40, {"loss": 0.25, "samples_per_s": 812.5}, ts=51.0))
    assert ev == MetricRecord("a", 1, 40, {"loss": 0.25, "samples_per_s": 812.5}, 51.0)


def test_rank_exit_ok() -> None:
    assert one("a", rank_exit(0, 0, ts=52.0)) == RankExited("a", 0, 0, None, 52.0)


def test_rank_exit_with_python_error_is_its_root_cause() -> None:
    error = rank_error("ValueError", "bad batch", ["Traceback (most recent call last):", "X"])
    ev = one("h", rank_exit(1, 1, error, ts=53.0))
    assert isinstance(ev, RankExited)
    assert ev.exit_code == 1
    assert ev.cause == named(
        "h", 1, "ValueError", "bad batch", ("Traceback (most recent call last):", "X"), 53.0
    )


def test_agent_exit_ok_has_no_cause() -> None:
    ev = one("a", agent_exit(0, ["done"]))
    assert ev == AgentExited("a", 0, ("done",), NOW, None)


def test_agent_exit_nonzero_without_summary_has_no_rank_cause() -> None:
    ev = one("a", agent_exit(1, ["RuntimeError: rendezvous timed out"]))
    assert isinstance(ev, AgentExited)
    assert (ev.exit_code, ev.cause) == (1, None)


def test_torchrun_summary_gives_the_killed_rank() -> None:
    tail = ["some earlier output", *torchrun_summary((0, 1, -9, 123))]
    ev = one("node-a", agent_exit(1, tail))
    assert isinstance(ev, AgentExited)
    cause = ev.cause
    assert cause is not None
    assert (cause.host, cause.rank, cause.exc_type, cause.message) == (
        "node-a",
        1,
        "Signal",
        "killed by SIGKILL",
    )
    assert cause.headline() == "rank 1 on node-a: Signal: killed by SIGKILL"
    assert cause.traceback == tuple(tail[-15:])


def test_torchrun_summary_with_exit_code() -> None:
    cause = torchrun_failure("h", torchrun_summary((0, 4, 3, 77)))
    assert cause is not None
    assert (cause.rank, cause.exc_type, cause.message) == (4, "ExitCode", "exited with code 3")


def test_torchrun_summary_unknown_signal_number() -> None:
    cause = torchrun_failure("h", ["  rank      : 0 (local_rank: 0)", "  exitcode  : -99 (pid: 1)"])
    assert cause is not None
    assert cause.message == "killed by signal 99"


def test_torchrun_summary_picks_the_root_cause_not_the_other_failures() -> None:
    # torchrun lists the *other* failures first and the root cause last.
    tail = torchrun_summary((0, 2, -9, 200), (1, 3, 1, 201))
    cause = torchrun_failure("h", tail)
    assert cause is not None
    assert (cause.rank, cause.message) == (2, "killed by SIGKILL")


def test_torchrun_summary_prefers_the_killed_rank_over_a_same_second_peer() -> None:
    # torchrun stamps failures in whole seconds and breaks the tie by rank: rank 0,
    # which died of the broken connection, can stand as "Root Cause" while rank 1 was
    # the one killed. The killed rank never reported itself: it is the cause.
    tail = torchrun_summary((0, 0, 1, 300), (1, 1, -9, 301))
    cause = torchrun_failure("h", tail)
    assert cause is not None
    assert (cause.rank, cause.message) == (1, "killed by SIGKILL")


def test_torchrun_stopping_a_peer_does_not_outrank_the_first_failure() -> None:
    # Rank 0 failed first; torchrun then sent SIGTERM to rank 1, which died before it
    # could report its own error. SIGTERM is torchrun's doing: the root cause stays.
    tail = torchrun_summary((0, 0, 1, 300), (1, 1, -15, 301))
    cause = torchrun_failure("h", tail)
    assert cause is not None
    assert (cause.rank, cause.exc_type) == (0, "ExitCode")
    alone = torchrun_failure("h", ["  rank      : 1 (local_rank: 1)", "  exitcode  : -15 (pid: 1)"])
    assert alone is not None and alone.message == "killed by SIGTERM"


def test_the_killed_rank_is_found_above_long_tracebacks_through_the_summary() -> None:
    # A parameter server killed by SIGKILL is listed first under "Failures:"; the two
    # workers that died of the broken connection follow with long tracebacks, so the
    # agent's 40-line tail holds only rank 0's "Root Cause" entry. The agent keeps the
    # summary lines of the whole output apart; the parser reads those.
    from dmlctl import torchrun_report, wire

    full = torchrun_summary((0, 0, 1, 300), (1, 2, -9, 302), (2, 1, 1, 301))
    traceback = ["  traceback : Traceback (most recent call last):"] + [
        f'    File "train.py", line {i}, in <module>' for i in range(30)
    ]
    at = full.index("[2]:") + 7  # after the peer's entry
    full = full[:at] + traceback + full[at:]
    tail = full[-40:]
    assert not any("rank      : 2" in line for line in tail)  # pushed out of the tail
    summary = [line for line in full if torchrun_report.is_failure_summary_line(line)]
    cause = torchrun_failure("h", tail, 0.0, summary)
    assert cause is not None
    assert (cause.rank, cause.message) == (2, "killed by SIGKILL")
    assert cause.traceback == tuple(tail[-15:])  # what the user reads stays the tail
    ev = one(
        "h",
        wire.encode(wire.ExitMsg(1, tuple(tail), tuple(summary))),
    )
    assert isinstance(ev, AgentExited) and ev.cause is not None and ev.cause.rank == 2


def test_no_summary_no_cause() -> None:
    assert torchrun_failure("h", ["plain output", "exitcode  : 1"]) is None
    assert torchrun_failure("h", []) is None


def msg(fields: dict[str, Any]) -> str:
    """A message line as an agent of this version writes it, from its fields."""
    return json.dumps({**fields, "v": wire.VERSION})


@pytest.mark.parametrize("raw", ["not json at all", "[1, 2, 3]", '{"no": "kind"}', ""])
def test_lines_that_are_no_message_are_kept_as_agent_log_lines(raw: str) -> None:
    assert parse_line("a", raw, NOW) == [LogLines("a", None, Stream.AGENT, (raw,), NOW)]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"k": "log", "v": 1, "r": 0', "not JSON"),  # cut off: no message at all
        ('{"k": "mystery", "v": 1}', "not understood (unknown message kind 'mystery')"),
        ('{"k": "log", "v": 1, "r": 0, "s": "sideways", "l": ["x"]}', "KeyError: 'sideways'"),
        ('{"k": "rank", "v": 1, "rec": {"kind": "start", "rank": "zero", "ts": 1}}', "zero"),
        ('{"k": "exit", "v": 1, "code": "boom"}', "bad exit message"),
        ('{"k": "log", "r": 0, "s": "stdout", "l": ["x"]}', "wire version None, not 1"),
        ('{"k": "log", "v": 2, "r": 0, "s": "stdout", "l": ["x"]}', "an agent of another dmlctl"),
        ('{"k": "rank", "v": 1, "rec": {"kind": "future", "rank": 0, "ts": 1.0}}', "'future'"),
        ('{"k": "agent", "v": 1, "state": "alive", "procs": [["R", 1, 2]]}', "procs is not"),
        ('{"k": "agent", "v": 1, "state": "sleeping"}', "unknown agent state 'sleeping'"),
        ('{"k": "agent", "v": 1, "state": "started"}', "without its pid"),
        ('{"k": "rank", "v": 1, "rec": {"kind": "exit", "rank": 0, "ts": 1, "code": "x"}}', "x"),
        ("[" * 100_000, "not JSON"),  # deeper than the decoder goes
    ],
)
def test_a_message_not_understood_is_kept_with_the_reason(raw: str, why: str) -> None:
    (ev,) = parse_line("a", raw, NOW)
    assert isinstance(ev, LogLines) and (ev.rank, ev.stream) == (None, Stream.AGENT)
    assert ev.lines[0].endswith(raw)
    assert why in ev.lines[0] or (why == "not JSON" and ev.lines[0] == raw), ev.lines[0]


def test_odd_fields_of_a_rank_record_are_kept_not_fatal() -> None:
    rec = {"kind": "exit", "rank": 0, "ts": 1.0, "code": 1, "error": "boom", "coll": [1]}
    (ev,) = parse_line("a", msg({"k": "rank", "rec": rec}), NOW)
    assert isinstance(ev, RankExited) and ev.cause is not None
    assert (ev.cause.exc_type, ev.cause.message, ev.coll) == ("Error", "boom", {})


def test_every_message_decodes_to_what_was_encoded() -> None:
    messages: list[wire.Message] = [
        wire.LogMsg(3, "stderr", ("a", "b")),
        wire.LogMsg(None, "torchrun", ()),
        wire.RankMsg({"kind": "metric", "rank": 0, "ts": 1.0, "step": 2, "values": {}}),
        wire.StacksMsg(1, ("Thread 0x1",), "train.py:3 in main", None),
        wire.AgentMsg("started", pid=1, torchrun_pid=2),
        wire.AgentMsg("alive", procs={0: ("S", 1.5, 4096)}),
        wire.AgentMsg("dumped", stopped=(1,)),
        wire.ExitMsg(1, ("t",), ("rank : 0",), False, {"type": "SpecInvalid", "message": "m"}),
    ]
    for msg in messages:
        line = wire.encode(msg)
        assert '"v":1' in line and "\n" not in line
        assert wire.decode(line) == msg
    rec = '{"kind":"exit","code":0,"error":null,"rank":0,"ts":1.0}'
    assert wire.decode(wire.encode_rank_record(rec)) == wire.RankMsg(json.loads(rec))


def test_a_heartbeat_carries_what_the_rank_does() -> None:
    rec = {
        "kind": "heartbeat",
        "rank": 1,
        "ts": 5.0,
        "progress": 42,
        "armed": True,
        "since": 0.2,
        "step_s": 0.05,
        "where": "train.py:9 in step",
        "inner": "threading.py:320 in wait",
        "phase": "eval",
        "phase_s": 2.0,
        "limit": 60,
        "coll": {"0": [11, 10, "all_reduce", 1.5, 2], "1": [3, 3, None, None]},
    }
    beat = one("a", msg({"k": "rank", "rec": rec}))
    assert beat == Heartbeat(
        "a",
        1,
        42,
        5.0,
        armed=True,
        since=0.2,
        phase="eval",
        phase_s=2.0,
        limit=60.0,
        step_s=0.05,
        where="train.py:9 in step",
        inner="threading.py:320 in wait",
        coll={"0": Collective(11, 10, "all_reduce", 1.5, 2), "1": Collective(3, 3)},
    )
    bare = one(
        "a",
        json.dumps(
            {"k": "rank", "v": 1, "rec": {"kind": "heartbeat", "rank": 0, "ts": 1.0, "progress": 0}}
        ),
    )
    assert bare == Heartbeat("a", 0, 0, 1.0)


def test_stack_dumps_and_the_end_of_a_dump_are_events() -> None:
    line = json.dumps(
        {
            "k": "stacks",
            "v": 1,
            "r": 3,
            "l": ["Thread 0x1:", '  File "t.py", line 2 in f'],
            "where": "t.py:2 in f",
            "inner": None,
        }
    )
    assert one("b", line) == StackDump(
        "b", 3, ("Thread 0x1:", '  File "t.py", line 2 in f'), NOW, "t.py:2 in f", None
    )
    assert one("b", msg({"k": "agent", "state": "dumped", "stopped": [1]})) == (
        StacksDumped("b", (1,), NOW)
    )


def test_a_keepalive_carries_the_ranks_processes_and_an_exit_its_final_counts() -> None:
    alive = {
        "k": "agent",
        "v": 1,
        "state": "alive",
        "procs": {"0": ["S", 1.5, 4096], "1": ["T", 2, 0]},
    }
    assert one("a", msg(alive)) == ProcSample(
        "a", {0: ProcUsage("S", 1.5, 4096), 1: ProcUsage("T", 2.0, 0)}, NOW
    )
    assert parse_line("a", msg({"k": "agent", "state": "alive"}), NOW) == []
    rec = {
        "kind": "exit",
        "rank": 1,
        "ts": 3.0,
        "code": 0,
        "error": None,
        "coll": {"0": [12, 12, None, None, 2]},
    }
    assert one("a", msg({"k": "rank", "rec": rec})) == RankExited(
        "a", 1, 0, None, 3.0, {"0": Collective(12, 12, size=2)}
    )


def test_a_prepared_record_names_the_strategy() -> None:
    rec = {"kind": "prepared", "rank": 0, "ts": 2.0, "strategy": "local-sgd"}
    assert one("a", msg({"k": "rank", "rec": rec})) == Prepared("a", 0, "local-sgd", 2.0)


def test_torchruns_own_record_of_the_failed_ranks_names_the_rank_before_its_report() -> None:
    """The agent sends torchrun's typed record (dmlctl.agent.torchrun); the printed
    report, which names another rank here, is read only without it."""
    record = (
        wire.RankFailure(0, -15, 10, 100.0),  # torchrun stopping the others: weakest
        wire.RankFailure(2, 3, 12, 101.0),
        wire.RankFailure(1, 7, 11, 100.0),  # the first to end by itself
    )
    report = torchrun_summary((0, 2, 3, 9))
    line = wire.encode(wire.ExitMsg(1, tuple(report), tuple(report), failures=record))
    ev = one("h", line)
    assert isinstance(ev, AgentExited) and ev.cause is not None
    assert (ev.cause.rank, ev.cause.message) == (1, "exited with code 7")
    assert ev.cause.traceback == (
        "rank 0 (pid 10) killed by SIGTERM",
        "rank 2 (pid 12) exited with code 3",
        "rank 1 (pid 11) exited with code 7",
        "torchrun's report: logs/agent-h.log",
    )
    killed = (*record, wire.RankFailure(3, -9, 13, 102.0))  # a kill from outside wins
    line = wire.encode(wire.ExitMsg(1, failures=killed))
    ev = one("h", line)
    assert isinstance(ev, AgentExited) and ev.cause is not None
    assert (ev.cause.rank, ev.cause.message) == (3, "killed by SIGKILL")
    only_stopped = wire.encode(wire.ExitMsg(1, failures=record[:1]))
    ev = one("h", only_stopped)
    assert isinstance(ev, AgentExited) and ev.cause is not None
    assert (ev.cause.rank, ev.cause.message) == (0, "killed by SIGTERM")


def test_torchruns_record_is_written_and_read_back_per_attempt(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from dmlctl import protocol
    from dmlctl.agent.torchrun import read_failures, write_failures

    failures = {
        1: SimpleNamespace(exitcode=-9, pid=42, timestamp=1700000000),
        0: SimpleNamespace(exitcode=-15, pid=41, timestamp=1700000001),
    }
    env = {protocol.ENV_RANK_DIR: str(tmp_path), protocol.ENV_ATTEMPT: "2"}
    write_failures(failures, env)
    assert read_failures(str(tmp_path), "2") == (
        wire.RankFailure(0, -15, 41, 1700000001.0),
        wire.RankFailure(1, -9, 42, 1700000000.0),
    )
    assert read_failures(str(tmp_path), "1") == ()  # another attempt's: none
    (tmp_path / "torchrun-failures-3.json").write_text('[{"rank": "x"}]')
    assert read_failures(str(tmp_path), "3") == ()  # unreadable: the report is read instead
    write_failures(failures, {})  # a plain torchrun (no rank directory): nothing written
    gone = {protocol.ENV_RANK_DIR: str(tmp_path / "missing"), protocol.ENV_ATTEMPT: "4"}
    write_failures(failures, gone)  # cannot be written: nothing raised, nothing left
    assert not (tmp_path / "missing").exists()
