"""The hang rules (dmlctl.hangs.rules) on scripted rank views: who is blamed, and who
never is — a rank before its first step, after its data, in a phase, or busy."""

from __future__ import annotations

from typing import Any

import pytest

from dmlctl.hangs.rules import BUSY_CORES, STEP_FACTOR, RankView, find_hang
from dmlctl.runs.events import Collective

T = 30.0
IDLE = 0.0
BUSY = 1.0


def view(rank: int, **kw: Any) -> RankView:
    """A healthy training rank: armed, beating, just stepped, in group 0 with 10
    collectives done."""
    values: dict[str, Any] = {
        "rank": rank,
        "host": "h",
        "beat_age": 0.5,
        "stalled_for": 0.1,
        "armed": True,
        "cpu_rate": BUSY,
        "io_rate": 0.0,
        "proc_state": "R",
        "step_s": 0.05,
        "where": f"train.py:{80 + rank} in step",
        "inner": "threading.py:320 in wait",
        "coll": {"0": Collective(10, 10)},
    }
    values.update(kw)
    return RankView(**values)


def waits(entered: int, age: float, op: str = "all_reduce") -> dict[str, Collective]:
    """In group 0: entered collective ``entered`` and has waited ``age`` s in it."""
    return {"0": Collective(entered, entered - 1, op, age)}


def stuck(**kw: Any) -> dict[str, Any]:
    """Armed, idle and without progress for 40 s."""
    return {"stalled_for": 40.0, "cpu_rate": IDLE, "proc_state": "S", **kw}


def test_a_healthy_run_has_no_hang() -> None:
    assert find_hang([view(0), view(1)], T) is None


def test_a_rank_that_stopped_beating_is_frozen_when_its_process_is_stopped_or_idle() -> None:
    stopped = view(1, beat_age=31.0, proc_state="T", cpu_rate=IDLE)
    verdict = find_hang([view(0, coll=waits(11, 31)), stopped], T)
    assert verdict is not None
    assert (verdict.rank, verdict.reason, verdict.where) == (1, "frozen", "train.py:81 in step")
    assert verdict.detail == "sent no heartbeat for 31 s; its process is stopped"
    locked = view(1, beat_age=31.0, proc_state="S", cpu_rate=IDLE)  # a lock never released
    verdict = find_hang([view(0), locked], T)
    assert verdict is not None and verdict.detail.endswith("its process is idle")


def test_a_silent_rank_that_computes_or_does_io_is_not_frozen() -> None:
    """A long C call holding the interpreter's lock (unpickling a big dataset)."""
    assert find_hang([view(0), view(1, beat_age=45.0, cpu_rate=1.0)], T) is None
    assert find_hang([view(0), view(1, beat_age=45.0, cpu_rate=IDLE, io_rate=5e7)], T) is None


def test_a_silent_rank_starved_of_cpu_is_under_way_not_frozen() -> None:
    """64 ranks importing torch on 2 cores: each gets 0.03 of a core and may hold the
    interpreter's lock for longer than the hang timeout (loading a library), but the
    kernel holds it runnable, or in disk I/O: it is under way."""
    starting = {"armed": False, "beat_age": 45.0, "cpu_rate": 0.03, "coll": {}}
    for state in ("R", "D"):
        assert find_hang([view(0), view(1, proc_state=state, **starting)], T) is None
    verdict = find_hang([view(0), view(1, proc_state="S", **starting)], T)
    assert verdict is not None and (verdict.rank, verdict.reason) == (1, "frozen")


def test_the_rank_that_never_entered_the_collective_is_blamed_not_the_one_that_waits() -> None:
    views = [view(0, coll=waits(11, 41)), view(1, **stuck()), view(2, coll=waits(11, 35))]
    verdict = find_hang(views, T)
    assert verdict is not None
    assert (verdict.rank, verdict.reason, verdict.waiting) == (1, "stuck", (0, 2))
    assert verdict.detail == "never entered all_reduce #11, which ranks 0, 2 has waited in for 41 s"
    assert verdict.where == "train.py:81 in step"


def test_a_busy_rank_that_others_wait_for_is_slow_not_hung() -> None:
    """A long compile or a slow first batch: the others wait, the culprit computes."""
    views = [view(0, coll=waits(11, 300)), view(1, stalled_for=300.0, cpu_rate=0.9)]
    assert find_hang(views, T) is None


@pytest.mark.parametrize(
    "state",
    [
        {"armed": False},  # before its first step (data preparation), or after its data
        {"armed": False, "phase": "eval", "phase_s": 300.0},  # a declared phase
        {"cpu_rate": None},  # its CPU use is not known yet
        {"io_rate": 10e6},  # reading or writing: a checkpoint of its own, a download
    ],
)
def test_a_rank_in_a_non_step_stretch_is_never_blamed(state: dict[str, Any]) -> None:
    views = [view(0, coll=waits(11, 300)), view(1, **stuck(**state))]
    assert find_hang(views, T) is None


def test_slow_steps_stretch_the_limit() -> None:
    slow = 20.0  # a 20 s step: stuck only after STEP_FACTOR x 20 s
    views = [
        view(0, coll=waits(11, 70), step_s=slow),
        view(1, **stuck(stalled_for=70.0, step_s=slow)),
    ]
    assert find_hang(views, T) is None
    later = STEP_FACTOR * slow + 1
    views = [
        view(0, coll=waits(11, later), step_s=slow),
        view(1, **stuck(stalled_for=later, step_s=slow)),
    ]
    verdict = find_hang(views, T)
    assert verdict is not None and verdict.rank == 1


def test_a_phase_over_its_own_limit_is_a_hang_even_when_busy() -> None:
    views = [view(0), view(1, armed=False, phase="eval", phase_s=121.0, limit=120.0)]
    verdict = find_hang(views, T)
    assert verdict is not None
    assert (verdict.rank, verdict.reason) == (1, "phase")
    assert verdict.detail == "phase 'eval' ran 121 s, over its limit of 120 s"


def test_a_rank_that_exited_without_entering_the_collective_is_blamed() -> None:
    """Once the waiter said, after the exit, that it still waits."""
    views = [view(0, coll=waits(11, 31), beat_age=0.5), view(1, exit_code=0, exited_ago=0.2)]
    assert find_hang(views, T) is None  # its last beat may be older than the exit
    views = [view(0, coll=waits(11, 31), beat_age=0.5), view(1, exit_code=0, exited_ago=2.0)]
    verdict = find_hang(views, T)
    assert verdict is not None and (verdict.rank, verdict.reason) == (1, "exited")
    assert verdict.detail.startswith("exited (code 0) without entering all_reduce #11")


def test_a_collective_everyone_entered_that_never_completes() -> None:
    blocked = {"cpu_rate": IDLE, "proc_state": "S"}  # asleep in the collective's receive
    views = [view(0, coll=waits(11, 40), **blocked), view(1, coll=waits(11, 38), **blocked)]
    verdict = find_hang(views, T)
    assert verdict is not None
    assert (verdict.rank, verdict.reason, verdict.waiting) == (0, "collective", (0, 1))
    assert verdict.detail == "in all_reduce #11 for 40 s; every rank of its group (2) waits in it"


def test_a_collective_that_is_slow_or_has_members_unheard_of_is_not_hung() -> None:
    moving = [view(0, coll=waits(11, 40), io_rate=5e6), view(1, coll=waits(11, 38), io_rate=5e6)]
    assert find_hang(moving, T) is None  # a big broadcast on a slow network
    three = {"0": Collective(11, 10, "all_reduce", 40.0, size=3)}
    unheard = [view(0, coll=three, cpu_rate=IDLE), view(1, coll=three, cpu_rate=IDLE)]
    assert find_hang(unheard, T) is None  # rank 2 of the group never reported


def test_the_chase_follows_a_culprit_that_waits_elsewhere() -> None:
    """Rank 0 waits in group 0 for rank 1, which waits in group 1 for rank 2."""
    views = [
        view(0, coll={"0": Collective(11, 10, "all_reduce", 50.0), "1": Collective(3, 3)}),
        view(1, coll={"0": Collective(10, 10), "1": Collective(4, 3, "broadcast", 45.0)}),
        view(2, coll={"1": Collective(3, 3)}, **stuck()),
    ]
    verdict = find_hang(views, T)
    assert verdict is not None and (verdict.rank, verdict.reason) == (2, "stuck")
    assert "never entered broadcast #4 (group 1), which rank 1 has" in verdict.detail


def test_a_rank_missing_from_a_gpu_collective_is_blamed_by_its_nccl_counts() -> None:
    """A group on ``cpu:gloo,cuda:nccl`` has a row per backend (NCCL numbers its
    collectives apart): rank 0 waits in NCCL's #21 while both agree on gloo's counts."""
    views = [
        view(0, coll={"0": Collective(5, 5), "0/nccl": Collective(21, 20, "allreduce", 50.0)}),
        view(1, coll={"0": Collective(5, 5), "0/nccl": Collective(20, 20)}, **stuck()),
    ]
    verdict = find_hang(views, T)
    assert verdict is not None and (verdict.rank, verdict.reason) == (1, "stuck")
    assert "never entered allreduce #21 (NCCL), which rank 0 has" in verdict.detail


def test_ranks_waiting_for_each_other_are_a_cycle() -> None:
    views = [
        view(0, coll={"0": Collective(11, 10, "all_reduce", 50.0), "1": Collective(3, 3)}),
        view(1, coll={"0": Collective(10, 10), "1": Collective(4, 3, "broadcast", 45.0)}),
    ]
    verdict = find_hang(views, T)
    assert verdict is not None and verdict.reason == "cycle"
    assert "rank 0 waits in #11 of group 0; rank 1 waits in #4 of group 1" in verdict.detail


def test_a_deadlock_without_collectives_is_found_when_every_rank_is_idle() -> None:
    views = [view(0, **stuck(stalled_for=45.0)), view(1, **stuck())]
    verdict = find_hang(views, T)
    assert verdict is not None
    assert (verdict.rank, verdict.reason) == (0, "idle")
    assert verdict.detail == "no progress for 45 s and idle; rank 1 stalled or waiting too"


def test_one_idle_rank_while_another_works_is_not_a_hang() -> None:
    assert find_hang([view(0, **stuck()), view(1, stalled_for=45.0, cpu_rate=0.5)], T) is None


def test_parameter_servers_are_never_blamed_for_waiting() -> None:
    views = [
        view(0, **stuck()),
        view(1, role="server", armed=False, stalled_for=900.0, cpu_rate=IDLE),
    ]
    verdict = find_hang(views, T)
    assert verdict is not None and verdict.rank == 0


def test_busy_threshold_is_a_fraction_of_a_core() -> None:
    assert 0 < BUSY_CORES < 0.5
