"""The rank table at 80, 120, 160 and 240 columns: high-priority columns (rank, state,
step, loss, samples/s) are never cut, lower ones drop out whole, the last line is
elided at its end. Expected renderings are kept under ``fixtures/dashboard/``
(``UPDATE_GOLDEN=1`` rewrites them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from dmlctl.protocol import COMM_TOTALS
from dmlctl.runs.events import LogLines, MetricRecord, RankStarted, Stream
from dmlctl.runs.state import RunState, apply, new_run_state
from dmlctl.ui.format import rank_table
from dmlctl.ui.rank_table import compact_rate

GOLDEN = Path(__file__).parent / "fixtures" / "dashboard"
GLOO = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by"
    " peer [127.0.0.1]:29500 while waiting for the all-reduce of bucket 3 of 7"
)


def _state(strategy: str, roles: list[str], last: str) -> RunState:
    ranks = [(i, f"node-{i // 2}", role) for i, role in enumerate(roles)]
    state = new_run_state("r", "job", strategy, ranks, 0.0)
    totals = dict(zip(COMM_TOTALS, (5 * 1024.0 * 400, 3.0, 400, 20.0), strict=True))
    events: list[object] = []
    for rank, host, role in ranks:
        events.append(RankStarted(host, rank, rank, role, 100 + rank, 1.0))
        if role == "worker":
            values = {
                "loss": 0.123456 + rank,
                "samples_per_s": 12345.6,
                "epoch": 3,
                "comm_bytes_per_step": 20.0 * 1024,
                "comm_share": 0.6,
                "clock": 400.0,
                **totals,
            }
            events.append(MetricRecord(host, rank, 400, values, 2.0))
        stream = Stream.STDERR if last == GLOO else Stream.STDOUT
        events.append(LogLines(host, rank, stream, (last,), 3.0))
    return apply(state, events)  # type: ignore[arg-type]


CASES = {
    "ssgd": _state("ssgd", ["worker", "worker"], "step 400 epoch 3 loss 0.1235"),
    "ps": _state("asgd", ["worker", "worker", "server"], "serving 2 workers"),
    "failed": _state("ssgd", ["worker", "worker"], GLOO),
}


@pytest.mark.parametrize("width", [80, 120, 160, 240])
@pytest.mark.parametrize("case", sorted(CASES))
def test_high_priority_columns_are_never_cut(case: str, width: int) -> None:
    console = Console(record=True, width=width, color_system=None)
    console.print(rank_table(CASES[case].ranks))
    text = console.export_text()
    lines = [line.rstrip() for line in text.splitlines()]
    assert all(len(line) <= width for line in lines)
    header = lines[0].split()
    for column in ("rank", "state", "step", "loss", "samples/s"):
        assert column in header, (column, text)
    rows = lines[1:]
    assert "0.1235" in rows[0] and "12.3k" in rows[0] and "400" in rows[0]
    assert len(rows) == len(CASES[case].ranks)  # one line per rank: nothing wraps
    path = GOLDEN / f"{case}-{width}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_compact_rates() -> None:
    assert [compact_rate(v) for v in (None, 950.25, 12345.6, 4.1e6)] == [
        "-",
        "950.2",
        "12.3k",
        "4.1M",
    ]
