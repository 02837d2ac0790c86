"""The dashboard and the end-of-run summary at 80, 120, 160 and 240 columns: the
high-priority columns (rank, state, step, loss, samples/s) are never cut, lower ones
drop out whole, the last line is elided at its end. Expected renderings are kept under
``fixtures/dashboard/`` (``UPDATE_GOLDEN=1`` rewrites them; read them after)."""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from dmlctl.failure import named
from dmlctl.mesh import MeshLayout
from dmlctl.protocol import COMM_TOTALS
from dmlctl.runs.events import (
    Event,
    Finished,
    LogLines,
    MetricRecord,
    Prepared,
    RankExited,
    RankStarted,
    Stream,
)
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import RunState, new_run_state
from dmlctl.ui import render_dashboard, render_run_detail, render_summary
from dmlctl.ui.dashboard import fitting_view
from dmlctl.ui.numbers import compact_bytes, compact_rate
from dmlctl.ui.rank_table import pick_columns

GOLDEN = Path(__file__).parent / "fixtures" / "dashboard"
WIDTHS = [80, 120, 160, 240]
T0 = 1_700_000_000.0
GLOO = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by"
    " peer [127.0.0.1]:29500 while waiting for the all-reduce of bucket 3 of 7"
)
WORKER = {"loss": 0.123456, "samples_per_s": 12345.6, "epoch": 3}
COMM = {
    "comm_bytes_per_step": 3.4 * 1024 * 1024,
    **dict(zip(COMM_TOTALS, (3.4 * 1024 * 1024 * 400, 3.0, 400, 20.0), strict=True)),
    "comm_share": 0.6,
}
SERVER = {
    "staleness_median": 1.0,
    "staleness_max": 3.0,
    "push_per_s": 1520.0,
    "pull_per_s": 1498.0,
    "push_bytes_per_s": 28.9 * 1024 * 1024,
    "pull_bytes_per_s": 30.1 * 1024 * 1024,
    "clock_spread": 2.0,
}


def _state(
    strategy: str,
    roles: list[str],
    extra: dict[str, float],
    last: str,
    mesh: MeshLayout | None = None,
) -> RunState:
    """Ranks two to a host, each with one metric record at step 400 and one log line;
    ``mesh``: the run's device mesh."""
    ranks = [(i, f"node-{i // 2}", role) for i, role in enumerate(roles)]
    events: list[Event] = []
    for rank, host, role in ranks:
        events.append(RankStarted(host, rank, rank % 2, role, 100 + rank, T0 + 1))
        events.append(Prepared(host, rank, strategy, T0 + 1))  # the strategy wraps the model
        values = {**WORKER, **extra} if role == "worker" else SERVER
        values = {**values, "loss": 0.123456 + rank} if role == "worker" else values
        events.append(MetricRecord(host, rank, 400, values, T0 + 2))
        events.append(LogLines(host, rank, Stream.STDOUT, (last,), T0 + 3))
    return apply(new_run_state("r-20240101-abcd", "job", strategy, ranks, T0, mesh), events)


def _failed() -> RunState:
    """Rank 0 is killed; rank 1 fails on its next all-reduce with gloo's long error."""
    state = _state("ssgd", ["worker", "worker"], COMM, "step 400 epoch 3 loss 0.1235")
    cause = named("node-0", 1, "RuntimeError", GLOO[len("RuntimeError: ") :], (GLOO,), T0 + 5)
    return apply(
        state,
        [
            RankExited("node-0", 0, -9, None, T0 + 4),  # killed without a word
            LogLines("node-0", 1, Stream.STDERR, (GLOO,), T0 + 5),
            RankExited("node-0", 1, 1, cause, T0 + 5),
            Finished(T0 + 65),
        ],
    )


CASES = {
    "ssgd": _state("ssgd", ["worker", "worker"], COMM, "step 400 epoch 3 loss 0.1235"),
    "ps": _state("asgd", ["worker", "worker", "server"], {"clock": 400}, "serving 2 workers"),
    "failed": _failed(),
    # pipeline 2 × tensor 2, two stages per pipeline rank: the widest mesh labels
    "mesh": _state(
        "ssgd",
        ["worker"] * 4,
        COMM,
        "step 400 epoch 3 loss 0.1235",
        MeshLayout(pp=2, tp=2, schedule="Interleaved1F1B", microbatches=8),
    ),
}
VIEWS = {
    "dashboard": lambda s: render_dashboard(s, T0 + 30),
    "summary": lambda s: render_summary(s, "/runs/r"),
    "detail": lambda s: render_run_detail(s, T0 + 30),
}


def _render(renderable: RenderableType, width: int) -> str:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _table(text: str, state: RunState) -> tuple[str, list[str]]:
    """The rank table's header line and its rows (one per rank) in a rendering."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if {"rank", "state"} <= set(line.split()))
    return lines[at], lines[at + 1 : at + 1 + len(state.ranks)]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_views_at_every_width_keep_the_important_columns_whole(
    case: str, view: str, width: int
) -> None:
    state = CASES[case]
    text = _render(VIEWS[view](state), width)
    assert all(len(line.rstrip()) <= width for line in text.splitlines())
    header, rows = _table(text, state)
    for column in ("host", "rank", "state", "step", "loss", "samples/s"):
        assert column in header.split(), (column, text)
    cut = header.find("last line") if "last line" in header else len(header)
    assert not any("…" in row[:cut] for row in rows), text  # only the last line is elided
    assert "0.1235" in rows[0] and "12.3k" in rows[0] and " 400 " in rows[0], text
    assert [row.split()[0] for row in rows if "rank" in header.split()[:1]] in (
        [str(r.rank) for r in state.ranks],
        [],
    )
    path = GOLDEN / f"{case}-{view}-{width}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_pick_columns_drops_lower_priorities_whole() -> None:
    # rank(4, p0) state(9, p0) comm(14, p1) epoch(5, p1) host(6, p2)
    widths, prio = [4, 9, 14, 5, 6], [0, 0, 1, 1, 2]
    assert pick_columns(widths, prio, 200, last_line=True) == ([0, 1, 2, 3, 4], 152)
    assert pick_columns(widths, prio, 40, last_line=True) == ([0, 1, 2, 3], 0)
    # comm does not fit: the narrower epoch of the same priority still does; host
    # would fit but is of a lower priority than the dropped comm
    assert pick_columns(widths, prio, 30, last_line=False) == ([0, 1, 3], 0)
    # priority 0 is kept even past the width
    assert pick_columns(widths, prio, 5, last_line=True) == ([0, 1], 0)


def test_compact_numbers() -> None:
    assert [compact_rate(v) for v in (None, 950.25, 12345.6, 4.1e6)] == [
        "-",
        "950.2",
        "12.3k",
        "4.1M",
    ]
    assert [compact_bytes(v) for v in (None, True, 512, 3.4 * 2**20, 5 * 2**40)] == [
        "-",
        "-",
        "512 B",
        "3.4 MiB",
        "5120.0 GiB",
    ]


def test_a_frame_fits_a_short_terminal_by_cutting_the_log_tail_then_rank_rows() -> None:
    console = Console(width=80, height=24, color_system=None, file=io.StringIO())
    state = CASES["failed"]
    bare = len(_render(render_dashboard(state, T0, tail_lines=0, legend=False), 80).splitlines())
    legend = len(_render(render_dashboard(state, T0, tail_lines=0), 80).splitlines()) - bare
    assert legend == 1  # what comm/step means, under the table (comm % gave way to host)

    def height(limit: int, tail: int = 12) -> int:
        return len(_render(fitting_view(state, T0, console, limit, tail), 80).splitlines())

    assert height(bare + 3) == bare + 3  # the rule and two tail lines; no legend then
    # no more than asked, the legend with it
    assert height(bare + 30) == bare + legend + 1 + len(state.tail[-12:])
    assert height(bare + 3, tail=0) == bare + legend
    assert height(bare) == bare
    many = _state("ssgd", ["worker"] * 40, COMM, "step 400 epoch 3 loss 0.1235")
    for limit in (14, 24):
        text = _render(fitting_view(many, T0, console, limit, 12), 80)
        assert len(text.splitlines()) <= limit, text
        assert "more" in text, text  # the caption counts the ranks left out
    one_row = _render(fitting_view(many, T0, console, 3, 12), 80)
    assert sum(line.split()[:1] == ["node-0"] for line in one_row.splitlines()) == 1


def test_a_live_views_columns_stay_when_a_value_narrows_again() -> None:
    """A column dropped when a value widened came back when it narrowed, and went again:
    the live view chooses each column at its widest so far."""

    def header(state: RunState, seen: dict[str, int] | None) -> list[str]:
        text = _render(render_dashboard(state, T0 + 30, seen=seen), 80)
        return next(
            line.split() for line in text.splitlines() if line.split()[:2] == ["host", "rank"]
        )

    def with_loss(loss: float) -> RunState:
        ranks = tuple(dataclasses.replace(r, loss=loss) for r in CASES["ssgd"].ranks)
        return dataclasses.replace(CASES["ssgd"], ranks=ranks)

    narrow, wide = with_loss(0.5), with_loss(123456789.123)
    assert header(narrow, None) != header(wide, None)  # a column gives way to the wide loss
    seen: dict[str, int] = {}
    frames = [header(state, seen) for state in (narrow, wide, narrow, wide)]
    assert frames[1] == frames[2] == frames[3], frames  # and stays away
