"""One type for a failure and one judge of a run's root cause (``dmlctl.failure``): the
kinds each producer gives, the budget each kind spends, and the ordering rules as a
table."""

from __future__ import annotations

import errno
import json

import pytest

from dmlctl.failure import (
    CONTROLLER,
    Evidence,
    Failure,
    Kind,
    error_kind,
    exception_kind,
    exit_kind,
    explains_better,
    failure_from_dict,
    is_collateral,
    named,
    pick_root_cause,
)
from dmlctl.launch.policy import BUDGETS, FailureKind, classify


def _f(
    host: str, rank: int | None, kind: Kind, evidence: Evidence, ts: float, name: str = "E"
) -> Failure:
    collateral = kind is Kind.COLLATERAL
    return Failure(
        host, rank, name, "m", (), ts, kind=kind, evidence=evidence, collateral=collateral
    )


# (what, new, old, new explains better)
R, S, X = Evidence.RECORD, Evidence.SEEN, Evidence.EXIT
CASES = [
    ("anything beats nothing", _f("a", 0, Kind.COLLATERAL, X, 9.0), None, True),
    (
        "a root failure beats a collateral one that came first",
        _f("a", 1, Kind.USER, R, 5.0),
        _f("a", 0, Kind.COLLATERAL, R, 1.0),
        True,
    ),
    (
        "a collateral one never replaces a root failure",
        _f("a", 0, Kind.COLLATERAL, R, 1.0),
        _f("a", 1, Kind.USER, R, 5.0),
        False,
    ),
    (
        "a rank killed without a word (torchrun's summary) beats its peers' collateral errors",
        _f("a", 1, Kind.KILLED, X, 9.0),
        _f("a", 0, Kind.COLLATERAL, R, 1.0),
        True,
    ),
    (
        "torchrun's exit code of a rank never replaces that rank's own record",
        _f("a", 0, Kind.USER, X, 0.5),
        _f("a", 0, Kind.COLLATERAL, R, 1.0),
        False,
    ),
    (
        "a rank's own record replaces its exit code",
        _f("a", 0, Kind.COLLATERAL, R, 1.0),
        _f("a", 0, Kind.USER, X, 0.5),
        True,
    ),
    (
        '"torchrun exited with code 1" says less than a rank of that host',
        _f("a", None, Kind.AGENT, X, 0.5),
        _f("a", 0, Kind.COLLATERAL, R, 1.0),
        False,
    ),
    (
        "the controller's own failure beats an exit code alone (records lost with the run dir)",
        _f(CONTROLLER, None, Kind.RECORDS, S, 9.0),
        _f("a", 0, Kind.USER, X, 1.0),
        True,
    ),
    (
        "the controller's failure beats collateral errors",
        _f(CONTROLLER, None, Kind.RECORDS, S, 9.0),
        _f("a", 0, Kind.COLLATERAL, R, 1.0),
        True,
    ),
    (
        "between root failures known from records, the earlier",
        _f("b", 2, Kind.USER, R, 5.0),
        _f("a", 0, Kind.USER, R, 6.0),
        True,
    ),
    (
        "a later observation does not replace an earlier record",
        _f(CONTROLLER, None, Kind.DISK_FULL, S, 9.0),
        _f("a", 0, Kind.USER, R, 1.0),
        False,
    ),
    (
        "a hang beats the exit codes of the teardown it caused",
        _f("a", 1, Kind.HANG, S, 9.0),
        _f("a", 0, Kind.KILLED, X, 9.5),
        True,
    ),
    (
        "the end of the run's Slurm job explains the deaths in it that came first",
        _f(CONTROLLER, None, Kind.ALLOCATION, S, 9.0, "AllocationEnded"),
        _f("a", 0, Kind.USER, R, 1.0),
        True,
    ),
    (
        "nothing replaces the end of the run's Slurm job",
        _f("a", 0, Kind.USER, R, 1.0),
        _f(CONTROLLER, None, Kind.ALLOCATION, S, 9.0, "AllocationEnded"),
        False,
    ),
    (
        "the run's directory deleted explains a rank's save into it that failed first",
        _f(CONTROLLER, None, Kind.RECORDS, S, 9.0, "RunDirGone"),
        _f("a", 0, Kind.USER, R, 8.5, "FileNotFoundError"),
        True,
    ),
    (
        "the same time and strength: the one known first stays",
        _f("b", 2, Kind.USER, R, 5.0),
        _f("a", 0, Kind.USER, R, 5.0),
        False,
    ),
]


@pytest.mark.parametrize(
    ("new", "old", "better"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_which_failure_explains_a_run_better(
    new: Failure, old: Failure | None, better: bool
) -> None:
    assert explains_better(new, old) is better


def test_the_root_cause_of_a_list_is_the_same_in_any_arrival_order() -> None:
    peers = [_f("a", 0, Kind.COLLATERAL, R, 10.2), _f("b", 2, Kind.COLLATERAL, R, 10.4)]
    killed = _f("a", 1, Kind.KILLED, X, 11.0)
    summary_of_a_peer = _f("b", 2, Kind.USER, X, 11.0)
    failures = [*peers, killed, summary_of_a_peer]
    for order in (failures, failures[::-1], [failures[2], failures[0], failures[3], failures[1]]):
        assert pick_root_cause(order) == killed
    assert pick_root_cause([]) is None


def test_a_ranks_exception_has_the_kind_its_type_and_text_say() -> None:
    assert exception_kind(ValueError("bad batch")) is Kind.USER
    assert exception_kind(OSError(errno.ENOSPC, "No space left on device")) is Kind.DISK_FULL
    assert exception_kind(MemoryError()) is Kind.OOM
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    assert exception_kind(gloo) is Kind.COLLATERAL
    assert error_kind("torch.OutOfMemoryError", "CUDA out of memory") is Kind.OOM
    assert error_kind("CheckpointForeign", "written by run x") is Kind.CHECKPOINT
    assert error_kind("DistNetworkError", "failed to recv") is Kind.COLLATERAL
    # A corrupt checkpoint another rank refused: a consequence for the root cause, but
    # still a checkpoint failure for the budget (never restarted).
    refused = "another rank refused checkpoint step-5"
    assert error_kind("CheckpointCorrupt", refused) is Kind.CHECKPOINT
    assert is_collateral("CheckpointCorrupt", refused)
    peer = named("a", 1, "CheckpointCorrupt", refused)
    assert peer.collateral and classify(peer) is FailureKind.FATAL


@pytest.mark.parametrize(
    ("code", "kind"),
    [(1, Kind.USER), (-9, Kind.KILLED), (-15, Kind.KILLED), (-11, Kind.CRASH), (-6, Kind.CRASH)],
)
def test_an_exit_status_alone_says_crash_killed_or_chosen(code: int, kind: Kind) -> None:
    assert exit_kind(code) is kind


def test_every_kind_spends_one_budget() -> None:
    assert set(BUDGETS) == set(Kind)
    fatal = {k for k, b in BUDGETS.items() if b is FailureKind.FATAL}
    assert fatal == {
        Kind.SPEC,
        Kind.DISK_FULL,
        Kind.RECORDS,
        Kind.CHECKPOINT,
        Kind.HOSTS_LOST,
        Kind.ALLOCATION,
    }
    assert classify(_f("a", 0, Kind.CRASH, X, 0.0, "Signal")) is FailureKind.USER
    assert classify(_f("a", 0, Kind.KILLED, X, 0.0, "Signal")) is FailureKind.INFRA


def test_a_failure_round_trips_and_an_older_record_gets_its_kind_from_its_names() -> None:
    hang = _f("a", 1, Kind.HANG, S, 3.0, "Hang")
    assert failure_from_dict(json.loads(json.dumps(hang.to_dict()))) == hang
    old = {"host": "a", "rank": 1, "exc_type": "Signal", "message": "killed by SIGSEGV"}
    assert failure_from_dict({**old, "traceback": [], "ts": 1.0}).kind is Kind.CRASH
    assert named(CONTROLLER, None, "RunDirGone", "deleted").kind is Kind.RECORDS
    # What an older record was known from, by its producer's names.
    assert named("a", 1, "Signal", "killed by SIGKILL").evidence is Evidence.EXIT
    assert named("a", 1, "ExitCode", "exited with code 1").evidence is Evidence.EXIT
    assert named("a", None, "AgentExit", "torchrun exited with code 1").evidence is Evidence.EXIT
    assert named("a", 1, "Hang", "sent no heartbeat").evidence is Evidence.SEEN
    assert named(CONTROLLER, None, "DiskFull", "no space").evidence is Evidence.SEEN
    assert named("a", 1, "ValueError", "bad batch").evidence is Evidence.RECORD
    assert named("a", None, "FileNotFoundError", "no ssh").kind is Kind.AGENT
