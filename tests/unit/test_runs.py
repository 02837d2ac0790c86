"""dmlctl.runs: the run directory store, the recorder, log streaming and stop_run,
on real directories under tmp_path (one tiny real process: ``true``, for a dead pid)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dmlctl.errors import RunNotFound, UsageError
from dmlctl.runs.control import STOP_SLACK_S, default_stop_timeout, stop_run
from dmlctl.runs.events import (
    AgentExited,
    Finished,
    LogLines,
    MetricRecord,
    Progress,
    RankExited,
    RankStarted,
    StackDump,
    Stream,
)
from dmlctl.runs.logs import log_path, print_stacks, stream_log
from dmlctl.runs.pids import start_ticks
from dmlctl.runs.recorder import RunRecorder
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import Phase, RankStatus, RunState, new_run_state
from dmlctl.runs.store import RunDir, RunStore, atomic_write

T0 = 1000.0


def running_state(run_id: str) -> RunState:
    state = new_run_state(run_id, "job", "ssgd", [(0, "a", "worker"), (1, "a", "worker")], T0)
    return apply(
        state,
        [Progress("starting", T0)]
        + [RankStarted("a", r, r, "worker", 100 + r, T0 + 1) for r in (0, 1)],
    )


def finished_state(run_id: str) -> RunState:
    return apply(
        running_state(run_id),
        [RankExited("a", r, 0, None, T0 + 2) for r in (0, 1)]
        + [AgentExited("a", 0, (), T0 + 3), Finished(T0 + 4)],
    )


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert start_ticks(proc.pid) is None
    return proc.pid


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore(tmp_path / "home")


def add_run(store: RunStore, run_id: str, state: RunState | None = None) -> RunDir:
    run = store.create(run_id)
    run.write_state(state if state is not None else finished_state(run_id))
    return run


# --------------------------------------------------------------------------- store


def test_create_makes_the_layout(store: RunStore) -> None:
    run = store.create("job-20260101-000000-abcd")
    assert run.path == store.home / "runs" / "job-20260101-000000-abcd"
    assert run.run_id == "job-20260101-000000-abcd"
    assert run.logs.is_dir() and run.specs.is_dir()
    with pytest.raises(FileExistsError):
        store.create("job-20260101-000000-abcd")


def test_runs_lists_only_runs_with_state_oldest_first(store: RunStore) -> None:
    add_run(store, "job-20260102-000000-bbbb")
    add_run(store, "job-20260101-000000-aaaa")
    store.create("job-20260103-000000-cccc")  # no state.json yet: not listed
    assert [r.run_id for r in store.runs()] == [
        "job-20260101-000000-aaaa",
        "job-20260102-000000-bbbb",
    ]


def test_runs_of_different_jobs_are_listed_oldest_first(store: RunStore) -> None:
    add_run(store, "zeta-20260101-000000-aaaa")
    add_run(store, "alpha-20260102-000000-bbbb")
    assert [r.run_id for r in store.runs()] == [
        "zeta-20260101-000000-aaaa",
        "alpha-20260102-000000-bbbb",
    ]


def test_runs_of_an_empty_home(tmp_path: Path) -> None:
    assert list(RunStore(tmp_path / "nothing").runs()) == []


def test_get_exact_prefix_and_last(store: RunStore) -> None:
    older = add_run(store, "train-20260101-000000-aaaa")
    newer = add_run(store, "eval-20260102-000000-bbbb")
    os.utime(older.state_file, (T0, T0))
    os.utime(newer.state_file, (T0 + 10, T0 + 10))
    assert store.get("train-20260101-000000-aaaa").path == older.path
    assert store.get("train").path == older.path
    assert store.get("eval-2026").path == newer.path
    assert store.get("last").path == newer.path
    os.utime(older.state_file, (T0 + 20, T0 + 20))  # state.json updated last
    assert store.get("last").path == older.path


def test_exact_id_wins_over_longer_ids_it_prefixes(store: RunStore) -> None:
    add_run(store, "run-1")
    add_run(store, "run-10")
    assert store.get("run-1").run_id == "run-1"


def test_ambiguous_prefix_names_the_candidates(store: RunStore) -> None:
    add_run(store, "job-20260101-000000-aaaa")
    add_run(store, "job-20260101-000000-bbbb")
    with pytest.raises(UsageError) as info:
        store.get("job-2026")
    assert not isinstance(info.value, RunNotFound)
    message = str(info.value)
    assert "ambiguous" in message
    assert "job-20260101-000000-aaaa" in message and "job-20260101-000000-bbbb" in message


def test_unknown_run_is_run_not_found(store: RunStore) -> None:
    add_run(store, "job-20260101-000000-aaaa")
    with pytest.raises(RunNotFound) as info:
        store.get("nope")
    assert str(info.value) == f"no run 'nope' in {store.root} (see 'dmlctl status')"
    with pytest.raises(RunNotFound):
        RunStore(store.home / "empty").get("last")


def test_atomic_write_replaces_and_leaves_no_tmp_files(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    for i in range(5):
        atomic_write(target, json.dumps({"i": i}))
    assert json.loads(target.read_text()) == {"i": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_state_round_trips_through_the_run_dir(store: RunStore) -> None:
    run = add_run(store, "r", finished_state("r"))
    assert run.read_state() == finished_state("r")
    assert sorted(p.name for p in run.path.iterdir()) == ["logs", "specs", "state.json"]


def test_read_state_is_lost_when_the_controller_is_dead(store: RunStore) -> None:
    run = add_run(store, "r", running_state("r"))
    run.controller_pid.write_text(str(dead_pid()))
    state = run.read_state()
    assert state.phase == Phase.LOST
    assert (
        state.detail
        == "controller is gone: dmlctl launch --resume r goes on from its newest checkpoint"
    )
    assert {rank.status for rank in state.ranks} == {RankStatus.UNKNOWN}  # nobody watches them
    # The file itself is untouched: "lost" is the reader's conclusion.
    assert json.loads(run.state_file.read_text())["phase"] == "running"


def test_read_state_is_lost_without_a_controller_pid(store: RunStore) -> None:
    run = add_run(store, "r", running_state("r"))
    assert run.controller() is None
    assert run.read_state().phase == Phase.LOST


def test_read_state_keeps_phase_while_the_controller_lives(store: RunStore) -> None:
    run = add_run(store, "r", running_state("r"))
    run.write_pid(os.getpid())
    assert run.read_state().phase == Phase.RUNNING


def test_read_state_of_a_finished_run_ignores_the_controller(store: RunStore) -> None:
    run = add_run(store, "r", finished_state("r"))
    run.controller_pid.write_text(str(dead_pid()))
    assert run.read_state().phase == Phase.SUCCEEDED


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "not a run state: expected a JSON object, got list"),
        ("{}", "not a run state: missing 'run_id'"),
        ('{"run_id": 3, "ranks": 5}', "not a run state"),
    ],
)
def test_unreadable_state_is_a_usage_error(store: RunStore, text: str, reason: str) -> None:
    run = store.create("r")
    run.state_file.write_text(text)
    with pytest.raises(UsageError, match=f"run r: state unreadable \\({reason}"):
        run.read_state()


def test_a_bad_phase_is_named_with_the_phases_known(store: RunStore) -> None:
    run = add_run(store, "r", finished_state("r"))
    data = json.loads(run.state_file.read_text())
    run.state_file.write_text(json.dumps({**data, "phase": 5}))
    with pytest.raises(UsageError, match=r"not a run state: phase 5 is not one of pending, "):
        run.read_state()


def test_a_state_file_that_is_a_directory_is_listed_as_unreadable(store: RunStore) -> None:
    add_run(store, "a-20260101-000000-aaaa", finished_state("a-20260101-000000-aaaa"))
    broken = store.create("b-20260101-000001-bbbb")
    broken.state_file.mkdir()
    listing = store.listing()
    assert [r.run_id for r in listing] == ["a-20260101-000000-aaaa", "b-20260101-000001-bbbb"]
    assert listing[1].error == "state.json: Is a directory", listing[1]


def test_listing_reads_every_run_on_its_own(store: RunStore) -> None:
    add_run(store, "a-20260101-000000-aaaa", finished_state("a-20260101-000000-aaaa"))
    broken = store.create("b-20260101-000001-bbbb")
    broken.state_file.write_text("{")
    add_run(store, "c-20260101-000002-cccc", finished_state("c-20260101-000002-cccc"))
    listing = store.listing()
    assert [(r.run_id, r.state is not None) for r in listing] == [
        ("a-20260101-000000-aaaa", True),
        ("b-20260101-000001-bbbb", False),
        ("c-20260101-000002-cccc", True),
    ]
    assert listing[1].error is not None and listing[1].error.startswith("not valid JSON")


# ------------------------------------------------------------------------ recorder


def test_recorder_writes_rank_merged_agent_and_metrics_files(store: RunStore) -> None:
    run = store.create("r")
    rec = RunRecorder(run)
    rec.record(
        [
            LogLines("a", 0, Stream.STDOUT, ("r0 first",), T0),
            LogLines("a", 1, Stream.STDERR, ("r1 warn",), T0),
            LogLines("a", None, Stream.AGENT, ("torchrun banner",), T0),
            MetricRecord("a", 1, 5, {"loss": 0.5}, T0 + 1),
            Progress("ignored", T0),
        ]
    )
    rec.flush()
    # On disk after flush, before close (dmlctl logs -f reads them while the run goes on).
    assert run.rank_log(0).read_text() == "r0 first\n"
    rec.record([LogLines("a", 0, Stream.STDOUT, ("r0 second",), T0)])
    rec.close()
    assert run.rank_log(0).read_text() == "r0 first\nr0 second\n"
    assert run.rank_log(1).read_text() == "r1 warn\n"
    assert (run.logs / "agent-a.log").read_text() == "torchrun banner\n"
    assert (run.logs / "merged.log").read_text().splitlines() == [
        "[rank 0] r0 first",
        "[rank 1] r1 warn",
        "[a] torchrun banner",
        "[rank 0] r0 second",
    ]
    (metric,) = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    assert metric == {"ts": T0 + 1, "host": "a", "rank": 1, "step": 5, "values": {"loss": 0.5}}


def test_recorder_writes_a_batch_of_lines_whole_and_keeps_stack_dumps(store: RunStore) -> None:
    run = store.create("r")
    rec = RunRecorder(run)
    rec.record(
        [
            LogLines("a", 0, Stream.STDOUT, ("one", "two", "three"), T0),
            StackDump(
                "a",
                1,
                ("Thread 0x1 (most recent call first):", '  File "t.py", line 3 in f'),
                T0,
                "t.py:3 in f",
            ),
            LogLines("a", 0, Stream.STDOUT, (), T0),
        ]
    )
    rec.close()
    assert run.rank_log(0).read_text() == "one\ntwo\nthree\n"
    assert (run.logs / "merged.log").read_text() == "[rank 0] one\n[rank 0] two\n[rank 0] three\n"
    dump = (run.stacks / "rank-1.txt").read_text().splitlines()
    assert dump[0].startswith("=== rank 1 on a, ") and dump[0].endswith(
        ": main thread at t.py:3 in f ==="
    )
    assert dump[1:3] == ["Thread 0x1 (most recent call first):", '  File "t.py", line 3 in f']
    out = io.BytesIO()
    print_stacks(run, None, out)
    assert out.getvalue().decode().splitlines()[1] == "Thread 0x1 (most recent call first):"
    with pytest.raises(UsageError, match="no stack dump of rank 0 \\(ranks: 1\\)"):
        print_stacks(run, 0, io.BytesIO())


def test_a_run_without_stack_dumps_says_so(store: RunStore) -> None:
    run = store.create("r")
    with pytest.raises(UsageError, match=r"has no stack dumps \(they are taken when a hang"):
        print_stacks(run, None, io.BytesIO())


# ---------------------------------------------------------------------------- logs


def logged_run(store: RunStore, state: RunState) -> RunDir:
    run = add_run(store, state.run_id, state)
    rec = RunRecorder(run)
    rec.record([LogLines("a", r % 2, Stream.STDOUT, (f"line {r}",), T0) for r in range(4)])
    rec.close()
    return run


def test_stream_merged_log(store: RunStore) -> None:
    run = logged_run(store, finished_state("r"))
    out = io.BytesIO()
    stream_log(run, None, follow=False, out=out)
    assert out.getvalue().decode().splitlines() == [
        "[rank 0] line 0",
        "[rank 1] line 1",
        "[rank 0] line 2",
        "[rank 1] line 3",
    ]


def test_stream_one_rank(store: RunStore) -> None:
    run = logged_run(store, finished_state("r"))
    out = io.BytesIO()
    stream_log(run, 1, follow=False, out=out)
    assert out.getvalue() == b"line 1\nline 3\n"
    assert log_path(run, 1) == run.rank_log(1)


HOSTILE = "clear \x1b[2J title \x1b]0;owned\x07 c1 \x9b2J nul \x00 end"


def test_escaped_log_shows_control_characters_as_text(store: RunStore) -> None:
    run = add_run(store, "r", finished_state("r"))
    run.rank_log(0).parent.mkdir(parents=True, exist_ok=True)
    run.rank_log(0).write_bytes(HOSTILE.encode() + b"\nlast, unended")
    out = io.BytesIO()
    stream_log(run, 0, follow=False, out=out, escape=True)
    assert out.getvalue().decode().splitlines() == [
        "clear  title \\x1b]0;owned\\x07 c1 \\x9b2J nul \\x00 end",
        "last, unended",
    ]
    raw = io.BytesIO()
    stream_log(run, 0, follow=False, out=raw)  # --raw, or piped: the bytes
    assert raw.getvalue() == HOSTILE.encode() + b"\nlast, unended"


def test_unknown_rank_names_the_valid_range(store: RunStore) -> None:
    run = logged_run(store, finished_state("r"))
    with pytest.raises(UsageError) as info:
        stream_log(run, 7, follow=False, out=io.BytesIO())
    assert str(info.value) == "run r has ranks 0 to 1; there is no rank 7"


def test_stream_a_log_that_does_not_exist_yet(store: RunStore) -> None:
    run = add_run(store, "r", finished_state("r"))
    out = io.BytesIO()
    stream_log(run, 0, follow=True, out=out)  # a finished run: returns at once
    assert out.getvalue() == b""


def test_follow_returns_once_the_run_ended_with_every_line(store: RunStore) -> None:
    run = logged_run(store, running_state("r"))
    run.write_pid(os.getpid())  # a live controller: not lost
    out = io.BytesIO()
    returned = threading.Event()
    still_following: list[bool] = []

    def finish_once_followed() -> None:
        # Wait until the follower has printed what exists, then end the run.
        deadline = time.monotonic() + 5.0
        while out.getvalue() != b"line 0\nline 2\n" and time.monotonic() < deadline:
            time.sleep(0.01)
        still_following.append(not returned.is_set())
        with open(run.rank_log(0), "a") as f:
            f.write("last words\n")
        run.write_state(finished_state("r"))

    writer = threading.Thread(target=finish_once_followed)
    writer.start()
    stream_log(run, 0, follow=True, out=out)
    returned.set()
    writer.join()
    assert still_following == [True]  # it did not return while the run was running
    assert out.getvalue() == b"line 0\nline 2\nlast words\n"


def test_follow_of_a_lost_run_returns(store: RunStore) -> None:
    run = logged_run(store, running_state("r"))  # no controller: read as lost
    out = io.BytesIO()
    stream_log(run, None, follow=True, out=out)
    assert out.getvalue().count(b"\n") == 4


# ------------------------------------------------------------------------- control


def test_stop_run_with_the_controller_gone_marks_it_stopped(store: RunStore) -> None:
    run = add_run(store, "r", running_state("r"))
    run.controller_pid.write_text(str(dead_pid()))
    message = stop_run(run, timeout=1.0)
    assert message == "run r: controller was gone; marked stopped"
    state = run.read_state()
    assert state.phase == Phase.STOPPED
    assert state.exit_code == 130
    assert state.stop_reason == "controller was gone"
    assert {r.status for r in state.ranks} == {RankStatus.STOPPED}
    assert RunState.from_dict(json.loads(run.summary.read_text())) == state


def test_stop_never_signals_a_process_that_took_the_controllers_pid(store: RunStore) -> None:
    """PID reuse: the recorded controller ended and its pid now names an unrelated
    process (same pid, another start time). ``stop`` signals nothing and says the
    controller is gone; the stranger lives on."""
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        ticks = start_ticks(stranger.pid)
        assert ticks is not None
        run = add_run(store, "r", running_state("r"))
        run.controller_pid.write_text(f"{stranger.pid} {ticks - 1}")  # the pid, reused
        assert not run.controller_alive()
        assert run.read_state().phase == Phase.LOST
        assert stop_run(run, timeout=1.0) == "run r: controller was gone; marked stopped"
        assert stranger.poll() is None  # not signalled
        # a bare pid (recorded by an older dmlctl) counts only a dmlctl process
        run.controller_pid.write_text(str(stranger.pid))
        assert not run.controller_alive()
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_signals_the_recorded_controller(store: RunStore) -> None:
    controller = subprocess.Popen(["sleep", "30"])
    try:
        run = add_run(store, "r", running_state("r"))
        run.write_pid(controller.pid)
        assert run.controller_alive()
        message = stop_run(run, timeout=5.0)
        assert controller.wait(5) == -15  # SIGTERM, through its pidfd
        assert (
            message
            == "run r: controller exited without recording the end of the run; marked stopped"
        )
    finally:
        controller.kill()


def test_stop_run_of_a_finished_run_changes_nothing(store: RunStore) -> None:
    run = add_run(store, "r", finished_state("r"))
    before = run.state_file.read_text()
    assert stop_run(run, timeout=1.0) == "run r already ended: succeeded"
    assert run.state_file.read_text() == before
    assert not run.summary.exists()


def test_dmlctl_stop_waits_for_the_jobs_stop_grace_by_default(store: RunStore) -> None:
    run = store.create("r")
    assert default_stop_timeout(run) == 30.0 + STOP_SLACK_S  # no readable plan: the default
    run.write_json(run.plan, {"restart": {"stop_grace": 120.0}})
    assert default_stop_timeout(run) == 120.0 + STOP_SLACK_S
