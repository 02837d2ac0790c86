"""The ``comm/step`` and ``comm %`` columns: run averages from the ranks' cumulative
totals (exact however many records were missed), the recent window beside them, and
the window alone for records of an older dmlctl."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console

from dmlctl.failure import named
from dmlctl.protocol import COMM_TOTALS
from dmlctl.runs.comm import CommTotals
from dmlctl.runs.events import Finished, MetricRecord, RankExited, RankStarted, Restarting
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import RankState, RunState, new_run_state
from dmlctl.runtime.metrics import MetricLogger
from dmlctl.runtime.optimizer import CommMeter
from dmlctl.ui.format import rank_table
from dmlctl.ui.metric_columns import STRATEGY_COLUMNS, AverageCell, with_recent

PERIOD, PAYLOAD, STEP_S, COMM_S = 4, 1024, 1.0, 2.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def local_sgd_records(steps: int, log_every: int) -> list[dict[str, float]]:
    """What a rank averaging every ``PERIOD`` steps reports, one record every
    ``log_every`` steps: ``PAYLOAD`` bytes in ``COMM_S`` seconds per averaging."""
    clock = FakeClock()
    meter = CommMeter(clock)
    records = []
    for step in range(1, steps + 1):
        clock.now += STEP_S
        meter.step()
        if step % PERIOD == 0:
            clock.now += COMM_S
            meter.add(PAYLOAD, COMM_S)
        if step % log_every == 0:
            records.append(meter.metrics())
    return records


def one_rank() -> RunState:
    return new_run_state("r", "job", "local-sgd", [(0, "a", "worker")], 0.0)


def fold(records: list[dict[str, Any]], state: RunState | None = None) -> RunState:
    events = [MetricRecord("a", 0, i, values, float(i)) for i, values in enumerate(records)]
    return apply(state or one_rank(), events)


def cells(rank: RankState) -> tuple[str, ...]:
    """The ``comm/step`` and ``comm %`` cells of ``rank``."""
    return tuple(str(STRATEGY_COLUMNS[k][1](rank)) for k in ("comm_bytes_per_step", "comm_share"))


def test_meter_reports_windows_and_exact_totals() -> None:
    records = local_sgd_records(steps=12, log_every=6)
    assert [r["comm_bytes_per_step"] for r in records] == [1024 / 6, 2 * 1024 / 6]
    last = records[-1]
    # 12 steps of 1 s, 3 averagings of 2 s: 18 s of wall time, 6 s communicating
    assert [last[k] for k in COMM_TOTALS] == [3 * 1024, 6.0, 12, 18.0]
    assert last["comm_share"] == pytest.approx(4.0 / 10.0)  # the second window
    clock = FakeClock()
    idle = CommMeter(clock)
    assert idle.metrics() == {}  # no step since the last record: nothing to report


def test_console_line_leaves_the_totals_to_the_controller(
    capsys: pytest.CaptureFixture[str],
) -> None:
    MetricLogger(0, None).log(3, {"loss": 0.5, **local_sgd_records(4, 4)[0]})
    line = capsys.readouterr().out
    assert "comm_bytes_per_step=256.0 " in line and "comm_share=" in line
    assert not any(key in line for key in COMM_TOTALS)


def test_run_average_is_exact_from_the_newest_totals() -> None:
    records = local_sgd_records(steps=36, log_every=3)
    rank = fold(records).ranks[0]
    totals = rank.comm_run()
    assert totals is not None and totals.bytes_per_step() == PAYLOAD / PERIOD
    assert totals == CommTotals(9 * PAYLOAD, 9 * COMM_S, 36, 36 * STEP_S + 9 * COMM_S)
    assert not any(key in rank.metrics for key in COMM_TOTALS)  # kept typed, once
    assert rank.metrics["comm_bytes_per_step"] == records[-1]["comm_bytes_per_step"]


def test_missed_records_leave_the_average_exact() -> None:
    records = local_sgd_records(steps=48, log_every=3)
    every = fold(records).ranks[0]
    sparse = fold(records[::5] + records[-1:]).ranks[0]
    assert sparse.comm_run() == every.comm_run()
    totals = every.comm_run()
    assert totals is not None and totals.bytes_per_step() == PAYLOAD / PERIOD
    assert totals.share() == pytest.approx(12 * COMM_S / (48 * STEP_S + 12 * COMM_S))
    assert cells(sparse) == cells(every) == ("256 B (341)", "33% (40)")


def test_records_without_totals_show_the_window() -> None:
    old = [{"loss": 1.0, "comm_bytes_per_step": 3 * 1024 * 1024, "comm_share": 0.25}]
    rank = fold(old).ranks[0]
    assert rank.comm_run() is None
    assert cells(rank) == ("3.0 MiB", "25%")
    # an older state.json has no totals either: it still loads and renders
    data = json.loads(json.dumps(fold(old).to_dict()))
    for r in data["ranks"]:
        del r["comm"], r["comm_before"]
    assert cells(RunState.from_dict(data).ranks[0]) == ("3.0 MiB", "25%")


def test_totals_survive_state_json_and_restarts() -> None:
    first = local_sgd_records(steps=8, log_every=8)
    state = fold(first)
    assert RunState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    cause = named("a", 0, "ValueError", "boom")
    state = apply(
        state,
        [
            RankExited("a", 0, 1, cause, 10.0),
            Restarting(1, cause, 0.0, 11.0),
            RankStarted("a", 0, 0, "worker", 300, 12.0),
        ],
    )
    rank = state.ranks[0]
    assert rank.comm is None and rank.comm_run() == CommTotals(2 * PAYLOAD, 4.0, 8, 12.0)
    second = local_sgd_records(steps=4, log_every=4)  # the new process counts from zero
    rank = fold(second, state).ranks[0]
    assert rank.comm_run() == CommTotals(3 * PAYLOAD, 6.0, 12, 18.0)
    assert apply(fold(second, state), [Finished(20.0)]).ranks[0].comm_run() == rank.comm_run()


@pytest.mark.parametrize(
    ("average", "recent", "shown"),
    [
        ("4.9 KiB", "19.5 KiB", "4.9 KiB (19.5)"),
        ("4.9 KiB", "1.2 MiB", "4.9 KiB (1.2 MiB)"),
        ("4.9 KiB", "0 B", "4.9 KiB (0 B)"),
        ("19.5 KiB", "19.5 KiB", "19.5 KiB"),
        ("15%", "62%", "15% (62)"),
        ("15%", "-", "15%"),
    ],
)
def test_average_with_the_recent_value_beside_it(average: str, recent: str, shown: str) -> None:
    assert with_recent(average, recent) == shown


@pytest.mark.parametrize("width", [80, 160])
def test_columns_show_average_and_recent_window(width: int) -> None:
    ranks = [(0, "a", "worker"), (1, "a", "worker")]
    state = new_run_state("r", "job", "local-sgd", ranks, 0.0)
    totals = dict(zip(COMM_TOTALS, (5 * 1024.0, 3.0, 20, 20.0), strict=True))
    window = {"loss": 0.5, "comm_bytes_per_step": 20.0 * 1024, "comm_share": 0.6}
    state = apply(
        state,
        [
            MetricRecord("a", 0, 20, {**window, **totals}, 1.0),
            MetricRecord("a", 1, 20, {**window, "comm_bytes_per_step": 256.0}, 1.0),
        ],
    )
    console = Console(record=True, width=width, color_system=None)
    console.print(rank_table(state.ranks, last_line=False))
    text = console.export_text()
    assert "comm/step" in text and "comm %" in text
    assert "256 B (20.0 KiB)" in text and "15% (60)" in text  # rank 0: avg (window)
    rank1 = [line for line in text.splitlines() if line.strip()][2]
    assert rank1.split()[-2:] == ["B", "60%"] and "256 B" in rank1  # window only


def test_a_squeezed_column_drops_the_recent_value_rather_than_cut_it() -> None:
    cell = AverageCell("20%", "12%")
    assert str(cell) == "20% (12)"
    shown = []
    for width in (8, 7, 3):
        console = Console(record=True, width=width, color_system=None)
        console.print(cell)
        shown.append(console.export_text().strip())
    assert shown == ["20% (12)", "20%", "20%"]


def test_a_count_column_shows_the_integer_it_is() -> None:
    """SSP's clock spread on a long run read ``1.01e+03``: a count is an integer."""
    from dmlctl.ui.metric_columns import STRATEGY_COLUMNS

    cell = STRATEGY_COLUMNS["clock_spread"].cell
    rank = RankState(0, "a", metrics={"clock_spread": 1013.0})
    assert cell(rank).plain == "1013"
    assert (
        STRATEGY_COLUMNS["primal_res"]
        .cell(RankState(0, "a", metrics={"primal_res": 0.012345}))
        .plain
        == "0.0123"
    )
