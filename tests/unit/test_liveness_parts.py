"""The rank-side pieces of the hang detector, without torch or processes: the progress
tracker, the frame namer, the flight-recorder summary, and the controller's view of
heartbeats."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from dmlctl.hangs.rules import START_BASE_S, START_PER_RANK_S, start_limit
from dmlctl.hangs.watch import STALE_BEAT_S, HangWatch
from dmlctl.runs.events import (
    Collective,
    Heartbeat,
    MetricRecord,
    ProcSample,
    ProcUsage,
    RankExited,
)
from dmlctl.runs.state import RankState, RankStatus, new_run_state
from dmlctl.runtime.collectives import _summarize, recorder_enabled
from dmlctl.runtime.progress import Tracker
from dmlctl.runtime.where import FrameNamer, frames_of


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --------------------------------------------------------------------------- tracker


def test_the_tracker_is_armed_only_while_steps_run() -> None:
    clock = Clock()
    t = Tracker(clock)
    assert t.snapshot() == {"progress": 0, "armed": False}  # preparing: not armed
    t.step()
    clock.now += 0.5
    t.step()
    snap = t.snapshot()
    assert (snap["progress"], snap["armed"], snap["step_s"], snap["since"]) == (2, True, 0.5, 0.0)
    t.data_end()
    assert t.snapshot()["armed"] is False and "since" not in t.snapshot()
    t.step()  # a log call of the final evaluation: progress, but no training step
    assert not t.armed and t.progress == 3
    t.step(batch=True)  # the next epoch's first batch
    assert t.armed


def test_a_phase_disarms_reports_its_age_and_is_no_part_of_a_step() -> None:
    clock = Clock()
    t = Tracker(clock)
    t.step()
    with t.phase("eval", limit=60.0):
        clock.now += 10.0
        snap = t.snapshot()
        assert (snap["armed"], snap["phase"], snap["phase_s"], snap["limit"]) == (
            False,
            "eval",
            10.0,
            60.0,
        )
        with t.phase("load"):
            assert t.snapshot()["phase"] == "load"  # the innermost phase
        assert t.snapshot()["phase"] == "eval"
    clock.now += 0.1
    t.step()
    assert t.snapshot()["step_s"] == pytest.approx(0.1)  # not 10.1: the phase is excluded
    assert t.armed and "phase" not in t.snapshot()


def test_a_phase_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit must be > 0"), Tracker().phase("x", limit=0):
        pass


def test_a_server_is_never_armed() -> None:
    t = Tracker()
    t.serving()
    t.step()
    assert t.armed is False


# --------------------------------------------------------------------------- frames


def test_frames_are_named_relative_to_the_script_and_library_code_by_file(tmp_path: Path) -> None:
    job = tmp_path / "job"
    lib = tmp_path / "venv" / "site-packages"
    namer = FrameNamer(str(job), libraries=[str(lib) + os.sep])
    stack = [
        (str(lib / "threading.py"), 320, "wait"),
        (str(job / "models" / "net.py"), 12, "forward"),
        (str(job / "train.py"), 88, "<module>"),
    ]
    assert namer.summary(stack) == ("models/net.py:12 in forward", "threading.py:320 in wait")
    assert namer.summary(stack[:1]) == (None, "threading.py:320 in wait")


def test_code_outside_the_libraries_counts_when_the_script_dir_has_none(tmp_path: Path) -> None:
    namer = FrameNamer(str(tmp_path / "job"), libraries=[str(tmp_path / "lib") + os.sep])
    stack = [(str(tmp_path / "lib" / "x.py"), 1, "f"), (str(tmp_path / "elsewhere.py"), 5, "g")]
    assert namer.summary(stack)[0] == "elsewhere.py:5 in g"


def test_a_script_kept_inside_a_library_directory_is_still_user_code(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    namer = FrameNamer(str(package / "bench" / "job"), libraries=[str(package) + os.sep])
    stack = [(str(package / "bench" / "job" / "train.py"), 9, "step")]
    assert namer.summary(stack) == ("train.py:9 in step", "train.py:9 in step")


def test_live_frames_are_listed_innermost_first() -> None:
    import sys

    frames = frames_of(sys._getframe())
    assert frames[0][2] == "test_live_frames_are_listed_innermost_first"


# --------------------------------------------------------------------------- flight recorder


def entry(
    seq: int,
    retired: bool,
    group: str = "0",
    op: str = "gloo:all_reduce",
    created_ns: int = 0,
    p2p: bool = False,
) -> dict[str, Any]:
    return {
        "collective_seq_id": seq,
        "retired": retired,
        "process_group": [group, "x"],
        "profiling_name": op,
        "time_created_ns": created_ns,
        "is_p2p": p2p,
    }


def test_the_flight_recorder_dump_becomes_counts_and_the_oldest_pending_collective() -> None:
    now = 50 * 10**9
    data = {
        "entries": [
            entry(8, True),
            entry(9, False, created_ns=now - 7 * 10**9),
            entry(10, False),
            entry(3, True, group="1", op="gloo:broadcast"),
            entry(1, False, p2p=True),
            entry(5, False, group="gone"),  # a destroyed group: left out
        ],
        "pg_status": {"1": {"last_enqueued_collective": "4", "last_completed_collective": "3"}},
    }
    got = _summarize(data, {"0": 2, "1": 2, "2": 2}, now)
    assert got == {
        "0": [10, 8, "all_reduce", 7.0, 2],
        "1": [4, 3, None, None, 2],
        "2": [0, 0, None, None, 2],
    }


class FakeRecorders:
    """``torch._C._distributed_c10d``'s two dumps: gloo's and NCCL's own recorder."""

    def __init__(self, gloo: dict[str, Any], nccl: dict[str, Any] | None) -> None:
        self.gloo, self.nccl = gloo, nccl

    def _dump_fr_trace_json(self, includeCollectives: bool) -> str:
        return json.dumps(self.gloo)

    def __getattr__(self, name: str) -> Any:
        if name == "_dump_nccl_trace_json" and self.nccl is not None:
            return lambda includeCollectives: json.dumps(self.nccl)
        raise AttributeError(name)


def test_a_groups_nccl_collectives_are_a_row_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NCCL keeps its own recorder and numbering (a CPU build of torch has none): its
    rows are ``<group>/nccl``, only for groups where NCCL entered a collective."""
    import sys
    import types

    from dmlctl.runtime import collectives

    c10d = types.SimpleNamespace(_world=types.SimpleNamespace(pg_names={}, pg_group_ranks={}))
    c10d._world.pg_names = {"pg0": "0", "pg1": "1"}
    c10d._world.pg_group_ranks = {"pg0": {0: 0, 1: 1}, "pg1": {0: 0, 1: 1}}
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True)
    gloo = {"entries": [entry(3, True)]}
    nccl = {"entries": [entry(40, True, op="nccl:all_reduce"), entry(41, False)]}
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "200")
    for name, module in {
        "torch.distributed": dist,
        "torch.distributed.distributed_c10d": c10d,
        "torch._C._distributed_c10d": FakeRecorders(gloo, nccl),
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    got = collectives.snapshot()
    assert got is not None
    assert got["0"][:2] == [3, 3] and got["1"][:2] == [0, 0]
    assert got["0/nccl"][:3] == [41, 40, "all_reduce"] and "1/nccl" not in got
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", FakeRecorders(gloo, None))
    assert set(collectives.snapshot() or {}) == {"0", "1"}


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"TORCH_FR_BUFFER_SIZE": "200"}, True),
        ({"TORCH_FR_BUFFER_SIZE": "0"}, False),
        ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}, True),
        ({"TORCH_FR_BUFFER_SIZE": "x"}, False),
    ],
)
def test_the_recorder_is_on_only_with_a_positive_size(env: dict[str, str], on: bool) -> None:
    assert recorder_enabled(env) is on


# --------------------------------------------------------------------------- controller view


def test_the_controller_ages_beats_on_its_own_clock_and_forgets_stale_ones() -> None:
    clock = Clock()
    watch = HangWatch(30.0, clock=clock)
    state = new_run_state("r", "j", "ssgd", [(0, "h", "worker")], 0.0)
    state = dataclasses.replace(state, ranks=(RankState(0, "h", status=RankStatus.RUNNING),))
    for i in range(4):
        watch.beat(
            Heartbeat(
                "h",
                0,
                5,
                0.0,
                armed=True,
                since=2.0,
                coll={"0": Collective(9, 8, "all_reduce", 1.0, size=2)},
            )
        )
        watch.sample(ProcSample("h", {0: ProcUsage("S", 1.0 + 0.01 * i, 1000 * i)}, 0.0))
        clock.now += 1.0
    (view,) = watch.views(state)
    assert view.beat_age == pytest.approx(1.0)
    assert view.stalled_for == pytest.approx(3.0)  # the rank's own count plus the beat's age
    assert view.coll["0"].age == pytest.approx(2.0) and view.coll["0"].size == 2
    assert view.cpu_rate == pytest.approx(0.01) and view.io_rate == pytest.approx(1000)
    assert view.proc_state == "S"
    clock.now += STALE_BEAT_S
    (stale,) = watch.views(state)
    assert stale.coll["0"].age is None and stale.cpu_rate is None
    assert stale.coll["0"].entered == 9  # the counts stay: membership is still known
    watch.shift(10.0)  # the controller stood still: not the rank's silence
    (shifted,) = watch.views(state)
    assert shifted.beat_age == pytest.approx(1.0 + STALE_BEAT_S - 10.0)


def test_a_ranks_final_counts_from_its_exit_replace_its_last_beats() -> None:
    clock = Clock()
    watch = HangWatch(30.0, clock=clock)
    watch.beat(Heartbeat("h", 0, 5, 0.0, coll={"0": Collective(9, 9)}))
    watch.exited(RankExited("h", 0, 0, None, 0.0, {"0": Collective(12, 12)}))
    state = dataclasses.replace(
        new_run_state("r", "j", "ssgd", [(0, "h", "worker")], 0.0),
        ranks=(RankState(0, "h", status=RankStatus.SUCCEEDED, exit_code=0),),
    )
    (view,) = watch.views(state)
    assert (view.exit_code, view.coll["0"].entered) == (0, 12)


def test_a_metric_record_newer_than_the_last_beat_voids_its_stale_wait() -> None:
    """The end of a run: rank 0's last beat is from a long wait in an all-reduce; its
    40 steps' records arrive, rank 1 exits, and rank 0 exits a moment later. Between
    those, the stale beat must not make rank 0 look idle without steps."""
    clock = Clock()
    watch = HangWatch(4.0, clock=clock)
    wait = {"0": Collective(2, 1, "all_reduce", 6.0, size=2)}
    watch.beat(Heartbeat("h", 0, 1, 100.0, armed=True, since=13.7, coll=wait))
    watch.sample(ProcSample("h", {0: ProcUsage("S", 1.0, 0)}, 100.0))
    clock.now += 3.0
    watch.sample(ProcSample("h", {0: ProcUsage("S", 1.0, 0)}, 103.0))
    ranks = (
        RankState(0, "h", status=RankStatus.RUNNING),
        RankState(1, "h", status=RankStatus.SUCCEEDED, exit_code=0),
    )
    state = dataclasses.replace(
        new_run_state("r", "j", "ssgd", [(0, "h", "worker"), (1, "h", "worker")], 0.0),
        ranks=ranks,
    )
    (before,) = watch.views(state)[:1]
    assert before.stalled_for > 4.0 and before.coll["0"].age is not None
    watch.recorded(MetricRecord("h", 0, 39, {"loss": 0.1}, 100.5))
    (after,) = watch.views(state)[:1]
    assert after.stalled_for < 1.0 and after.coll == {}
    assert watch.check(state) is None
    watch.recorded(MetricRecord("h", 0, 0, {"loss": 0.1}, 99.0))  # older than the beat
    assert watch.views(state)[0].coll == {}  # nothing undone, nothing new either


def test_a_rank_that_never_sends_its_first_heartbeat_is_hung_once_its_start_timeout_passed() -> (
    None
):
    """Named like any other hang: the first silent rank, once the attempt is older than
    the start timeout; a rank that beat once is judged by the other rules instead."""
    clock = Clock()
    watch = HangWatch(30.0, clock=clock, start_timeout=20.0)
    state = dataclasses.replace(
        new_run_state("r", "j", "ssgd", [(0, "a", "worker"), (1, "b", "worker")], 0.0),
        ranks=(
            RankState(0, "a", status=RankStatus.RUNNING),
            RankState(1, "b", status=RankStatus.PENDING),
        ),
    )
    watch.reset()
    watch.beat(Heartbeat("a", 0, 1, 0.0, armed=False))
    clock.now += 19.0
    assert watch.check(state) is None
    clock.now += 2.0
    verdict = watch.check(state)
    assert verdict is not None and (verdict.rank, verdict.host) == (1, "b")
    assert verdict.reason == "unstarted" and "restart.start_timeout 20 s" in verdict.detail
    assert watch.confirm(state, verdict)
    watch.beat(Heartbeat("b", 1, 1, 0.0, armed=False))
    assert not watch.confirm(state, verdict)  # it started after all
    watch.reset()  # a new attempt: its own start
    clock.now += 10.0
    assert watch.check(state) is None


def test_the_start_timeout_is_the_jobs_or_grows_with_the_world() -> None:
    assert start_limit(5.0, 64) == 5.0
    assert start_limit(None, 8) == START_BASE_S + 8 * START_PER_RANK_S
