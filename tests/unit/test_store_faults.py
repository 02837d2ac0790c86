"""A run store that keeps going (issue 12), with scripted host agents: a run directory
deleted while the run runs, a full disk, secrets hidden in what comes back, a start
failure of the spec's own making never restarted."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from dmlctl.failure import CONTROLLER, Evidence, Failure, Kind, named
from dmlctl.launch.policy import Action, Failed, FailureKind, RestartState, classify, step
from dmlctl.launch.supervisor import Supervisor
from dmlctl.runs.events import ControllerFailed, Event, LogLines, RankExited
from dmlctl.runs.files import DiskFull
from dmlctl.runs.parser import parse_line
from dmlctl.runs.redaction import redactor_of
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import Phase, new_run_state
from dmlctl.runs.store import RunDir
from dmlctl.spec.restart import RestartSpec
from dmlctl.transport.fake import (
    ScriptedTransport,
    agent_exit,
    agent_lines,
    agent_started,
    rank_error,
    rank_exit,
    rank_log,
    rank_start,
)
from tests.unit.test_supervisor import RecordingSink, make_plan, run_dir  # noqa: F401 - fixture


def _endless(host: str = "a") -> ScriptedTransport:
    """An agent whose rank 0 logs once, then runs until it is stopped."""
    lines = [agent_started(), rank_start(0, 0, host=host), rank_log(0, "step 1")]
    return ScriptedTransport(host, lines, hang=True)


def _delete(path: Path) -> None:
    """``rm -rf path`` that cannot lose a race with a writer making files in it (the
    path is gone at once; a plain rmtree can fail with "directory not empty")."""
    gone = path.with_name(path.name + ".deleted")
    path.rename(gone)
    shutil.rmtree(gone)


def test_a_deleted_run_directory_fails_the_run_within_seconds(
    tmp_path: Path,
    run_dir: RunDir,  # noqa: F811
) -> None:
    plan = make_plan(tmp_path, [1])

    def delete_once_running(ev: Event) -> None:
        if isinstance(ev, LogLines) and ev.rank == 0:
            threading.Thread(target=_delete, args=(run_dir.path,)).start()

    sink = RecordingSink(delete_once_running)
    sup = Supervisor(
        plan, run_dir, {"a": _endless()}, sink, fail_grace=0.2, stop_grace=0.0, stop_margin=1.0
    )
    start = time.monotonic()
    state = sup.run()
    assert time.monotonic() - start < 8.0
    assert state.phase == Phase.FAILED and state.exit_code == 1
    assert state.root_cause is not None and state.root_cause.exc_type == "RunDirGone"
    assert "was deleted" in state.root_cause.message
    assert sup.unrecorded is not None  # the end could not be written: said so
    assert not run_dir.path.exists()  # never made again behind the user's back


def test_a_run_directory_deleted_just_before_the_end_is_still_the_root_cause(
    tmp_path: Path,
    run_dir: RunDir,  # noqa: F811
) -> None:
    """The ranks fail at once because of the deletion (their checkpoint directory was
    inside it), before the once-a-second check: the end checks again."""
    plan = make_plan(tmp_path, [1])
    error = rank_error(  # as the rank's checkpoint manager says it
        "CheckpointError",
        "could not write checkpoint step 2 in /r/hosts/checkpoints: FileNotFoundError: the "
        "checkpoint directory /r/hosts/checkpoints was deleted while the run ran; it is not "
        "made again",
    )
    lines = [agent_started(), rank_start(0, 0, host="a"), rank_log(0, "step 1")]
    lines += [rank_exit(0, 1, error), agent_exit(1)]

    def delete_at_first_line(ev: Event) -> None:
        if isinstance(ev, LogLines) and ev.rank == 0 and run_dir.path.exists():
            _delete(run_dir.path)

    sink = RecordingSink(delete_at_first_line)
    state = Supervisor(plan, run_dir, {"a": ScriptedTransport("a", lines)}, sink).run()
    assert state.root_cause is not None and state.root_cause.exc_type == "RunDirGone", state
    assert not run_dir.path.exists()


class _FullRecorder:
    """Stands in for the run's log files on a full disk."""

    def record(self, batch: object) -> None:
        raise DiskFull("/runs/r/logs/rank-0.log", "no space left on the device writing x")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_full_disk_is_a_failure_that_is_never_restarted(
    tmp_path: Path,
    run_dir: RunDir,  # noqa: F811
) -> None:
    plan = make_plan(tmp_path, [1])
    transport = _endless()
    restart = RestartSpec(max_infra_restarts=3, max_user_restarts=3)
    sup = Supervisor(
        plan,
        run_dir,
        {"a": transport},
        RecordingSink(),
        fail_grace=0.2,
        stop_grace=0.0,
        stop_margin=1.0,
        restart=restart,
    )
    sup.writer.recorder = _FullRecorder()  # type: ignore[assignment]
    state = sup.run()
    assert state.phase == Phase.FAILED and state.restarts == 0
    assert state.root_cause is not None and state.root_cause.exc_type == "DiskFull"
    assert state.root_cause.host == "controller"
    assert run_dir.read_state().root_cause == state.root_cause  # recorded, from the reserve
    assert not run_dir.reserve.path.exists()  # given back at the end
    assert transport.process.stopped


@pytest.mark.parametrize("kind", ["SpecInvalid", "DiskFull", "RunDirGone", "CheckpointCorrupt"])
def test_fatal_causes_spend_no_budget(kind: str) -> None:
    cause = named("a", None, kind, "x")
    assert classify(cause) is FailureKind.FATAL
    restart = RestartSpec(max_infra_restarts=3, max_user_restarts=3)
    state, action = step(RestartState(phase=Phase.RUNNING), Failed(cause), 0.0, restart)
    assert action is Action.GIVE_UP and state.phase is Phase.FAILED
    assert state.infra_restarts_used == state.user_restarts_used == 0


def test_an_agent_that_cannot_start_its_run_is_a_spec_failure(
    tmp_path: Path,
    run_dir: RunDir,  # noqa: F811
) -> None:
    from dmlctl import wire

    plan = make_plan(tmp_path, [1])
    error = {"type": "SpecInvalid", "message": "cannot start torchrun: x"}
    exit_line = wire.encode(
        wire.ExitMsg(127, ("cannot start torchrun: embedded null byte",), error=error)
    )
    restart = RestartSpec(max_infra_restarts=3)
    sup = Supervisor(
        plan,
        run_dir,
        {"a": ScriptedTransport("a", [exit_line], exit_code=1)},
        RecordingSink(),
        restart=restart,
        fail_grace=0.2,
        stop_grace=0.0,
    )
    state = sup.run()
    assert state.phase == Phase.FAILED and state.restarts == 0
    assert state.root_cause is not None and state.root_cause.exc_type == "SpecInvalid"


def test_secrets_are_hidden_in_everything_that_comes_back(
    tmp_path: Path,
    run_dir: RunDir,  # noqa: F811
) -> None:
    plan = make_plan(tmp_path, [1], env={"API_TOKEN": "tok-12345678", "DB": "pg://u:pw1234@h/d"})
    lines = agent_lines([0], host="a", logs={0: ["token is tok-12345678", "db pg://u:pw1234@h/d"]})
    sink = RecordingSink()
    sup = Supervisor(
        plan, run_dir, {"a": ScriptedTransport("a", lines)}, sink, redactor=redactor_of(plan)
    )
    state = sup.run()
    shown = " ".join(t.text for t in state.tail)
    logged = run_dir.rank_log(0).read_text()
    for text in (shown, logged):
        assert "tok-12345678" not in text and "pw1234" not in text
        assert "token is ***" in text and "pg://u:***@h/d" in text


def test_controller_failed_is_the_root_cause_unless_a_rank_said_why() -> None:
    state = new_run_state("r", "j", "ssgd", [(0, "a", "worker")], 0.0)
    cause = named("controller", None, "DiskFull", "no space", (), 1.0)
    assert apply(state, [ControllerFailed(cause, 1.0)]).root_cause == cause
    own = named("a", 0, "DiskFull", "no space left writing checkpoint step 5", (), 0.5)
    failed = apply(state, [RankExited("a", 0, 1, own, 0.5)])
    assert apply(failed, [ControllerFailed(cause, 1.0)]).root_cause == own


def test_a_deleted_run_directory_explains_a_rank_known_only_by_its_exit_code() -> None:
    """The run directory deleted under a run: the ranks' exit records are lost with it,
    so torchrun's summary names rank 0's exit code — the controller's RunDirGone, seen
    after, is the root cause all the same (before: whichever of them came first)."""
    state = new_run_state("r", "j", "ssgd", [(0, "a", "worker")], 0.0)
    summary = ["Root Cause (first observed failure):", "  rank      : 0", "  exitcode  : 1"]
    exited = parse_line("a", agent_exit(1, summary), 1.0)
    gone = Failure(
        CONTROLLER,
        None,
        "RunDirGone",
        "deleted",
        (),
        2.0,
        kind=Kind.RECORDS,
        evidence=Evidence.SEEN,
    )
    state = apply(state, exited)
    assert state.root_cause is not None and state.root_cause.exc_type == "ExitCode"
    assert apply(state, [ControllerFailed(gone, 2.0)]).root_cause == gone


def test_private_folders_are_private_all_the_way_down(tmp_path: Path) -> None:
    from dmlctl.private_files import make_private_dirs

    tmp_path.chmod(0o755)
    make_private_dirs(str(tmp_path / "a" / "b" / "c"))
    make_private_dirs(str(tmp_path / "a" / "b" / "c") + "/")  # exists: fine
    for made in ("a", "a/b", "a/b/c"):
        assert (tmp_path / made).stat().st_mode & 0o777 == 0o700, made
    assert tmp_path.stat().st_mode & 0o777 == 0o755  # what existed is left alone
    (tmp_path / "file").write_text("")
    for blocked in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(OSError):  # a file where a folder should be
            make_private_dirs(str(blocked))
