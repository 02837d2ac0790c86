"""``status`` filters and limits, ``rm`` and ``prune`` on a real run store (real
directories and state files; no runs started)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from dmlctl.cli.app import main
from dmlctl.errors import UsageError
from dmlctl.runs.housekeeping import Filters, parse_age, prune, remove, select
from dmlctl.runs.state import Phase
from dmlctl.runs.store import RunStore
from tests.unit.test_runs import add_run, finished_state, running_state

DAY = 86400.0


def _id(job: str, i: int) -> str:
    return f"{job}-20260101-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i % 65536:04x}"


def _fill(store: RunStore, n: int, job: str = "train", ended: float = 1000.0) -> list[str]:
    ids = []
    for i in range(n):
        run_id = _id(job, i)
        state = finished_state(run_id)
        add_run(store, run_id, dataclasses.replace(state, ended_at=ended))
        ids.append(run_id)
    return ids


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    monkeypatch.setenv("DMLCTL_HOME", str(tmp_path / "home"))
    return RunStore(tmp_path / "home")


def test_status_shows_the_newest_20_and_reads_only_those(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _fill(store, 30)
    reads: list[str] = []
    real = RunStore.runs

    def counting(self: RunStore):  # type: ignore[no-untyped-def]
        for run in real(self):
            original = run.read_state

            def read(run=run, original=original):  # type: ignore[no-untyped-def]
                reads.append(run.run_id)
                return original()

            run.read_state = read  # type: ignore[method-assign]
            yield run

    monkeypatch.setattr(RunStore, "runs", counting)
    got = select(store, Filters(), 20)
    assert [r.run_id for r in got.rows] == ids[::-1][:20]
    assert got.total == 30 and got.more
    assert len(reads) == 20  # the other 10 state files were never opened
    everything = select(store, Filters(), None)
    assert len(everything.rows) == 30 and not everything.more


def test_filters_by_phase_and_job_name(store: RunStore) -> None:
    _fill(store, 3, job="a")
    _fill(store, 2, job="b-c")
    add_run(store, _id("a", 99), dataclasses.replace(finished_state("x"), phase=Phase.FAILED))
    failed = select(store, Filters((Phase.FAILED,)), 20)
    assert [r.run_id for r in failed.rows] == [_id("a", 99)]
    named = select(store, Filters(name="b-c"), 20)
    assert len(named.rows) == 2 and all(r.run_id.startswith("b-c-") for r in named.rows)


def test_rm_refuses_a_running_run_and_removes_finished_ones(
    store: RunStore, capsys: pytest.CaptureFixture[str]
) -> None:
    done = add_run(store, _id("a", 1))
    live = add_run(store, _id("a", 2), running_state(_id("a", 2)))
    live.write_pid(os.getpid())  # its controller: this very process
    with pytest.raises(UsageError, match="still running; stop it first"):
        remove(live)
    assert main(["rm", done.run_id, live.run_id]) == 2  # nothing removed
    assert done.path.is_dir() and live.path.is_dir()
    capsys.readouterr()
    assert main(["rm", done.run_id]) == 0
    assert capsys.readouterr().out.strip() == f"removed {done.run_id}"
    assert not done.path.exists() and live.path.is_dir()


def test_prune_removes_old_finished_runs_and_keeps_lost_ones(
    store: RunStore, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    old = _fill(store, 2, job="old", ended=now - 8 * DAY)
    new = _fill(store, 1, job="new", ended=now - DAY)
    lost = add_run(store, _id("lost", 5), running_state(_id("lost", 5)))  # no controller
    dry = prune(store, 7 * DAY, now, dry_run=True)
    assert sorted(dry.removed) == sorted(old) and all((store.root / r).is_dir() for r in old)
    assert main(["prune", "--older-than", "7d"]) == 0
    out = capsys.readouterr().out
    assert "removed 2 runs that ended over 7d ago; kept 1 lost run" in out
    assert not any((store.root / r).exists() for r in old)
    assert (store.root / new[0]).is_dir() and lost.path.is_dir()


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("7d", 7 * DAY)])
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


def test_parse_age_refuses_what_it_cannot_read() -> None:
    with pytest.raises(UsageError, match="--older-than: expected a number and a unit"):
        parse_age("a week")


def test_status_says_how_many_it_left_out(
    store: RunStore, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _fill(store, 25)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert sum(run_id in out for run_id in ids) == 20 and ids[0] not in out
    assert "the newest 20 shown of 25 runs; --all for every one" in out
    assert main(["status", "--all"]) == 0
    out = capsys.readouterr().out
    assert all(run_id in out for run_id in ids) and "--all for" not in out


def test_a_filter_no_run_matches_says_so_and_how_many_runs_there_are(
    store: RunStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--failed"]) == 0
    assert "no runs yet" in capsys.readouterr().out
    _fill(store, 3)  # all succeeded
    assert main(["status", "--failed"]) == 0
    out = capsys.readouterr().out
    assert "no run matches --failed (3 runs in all: dmlctl status)" in out, out
    assert main(["status", "--running", "--name", "other"]) == 0
    assert "no run matches --running --name other (3 runs in all" in capsys.readouterr().out
