"""The run's progress, epoch and ETA in the dashboard header and the plain mode."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console

from dmlctl.runs.state import Phase, RunState
from dmlctl.ui.format import run_header
from dmlctl.ui.plain import PlainPrinter
from dmlctl.ui.progress import bar, eta_seconds, run_progress
from tests.unit.test_runs import running_state


def _with_progress(values: dict[int, dict[str, float | int]]) -> RunState:
    state = running_state("r")
    ranks = tuple(
        dataclasses.replace(r, metrics={**r.metrics, **values.get(r.rank, {})}) for r in state.ranks
    )
    return dataclasses.replace(state, ranks=ranks, started_at=1000.0)


def test_run_progress_is_the_workers_mean_and_eta_follows_the_rate() -> None:
    state = _with_progress({0: {"progress": 0.2, "epoch": 1}, 1: {"progress": 0.3, "epoch": 1}})
    assert run_progress(state) == 0.25
    assert eta_seconds(state, now=1100.0) == 300.0  # 100 s for 25 %: 300 s to go
    assert eta_seconds(dataclasses.replace(state, phase=Phase.SUCCEEDED), 1100.0) is None
    assert run_progress(_with_progress({})) is None
    done = dataclasses.replace(_with_progress({0: {"progress": 0.92}}), phase=Phase.SUCCEEDED)
    assert run_progress(done) == 1.0  # its last report came before its last batches
    failed = dataclasses.replace(done, phase=Phase.FAILED)
    assert run_progress(failed) == 0.92


def test_bar_fills_in_eighths() -> None:
    assert bar(0.0, 4) == "    " and bar(1.0, 4) == "████"
    assert bar(0.5, 4) == "██  " and bar(0.5625, 4) == "██▎ "


def test_header_and_plain_mode_show_progress_epoch_and_eta() -> None:
    state = _with_progress({0: {"progress": 0.5, "epoch": 2}, 1: {"progress": 0.5, "epoch": 3}})
    console = Console(width=100, record=True, color_system=None)
    console.print(run_header(state, 1060.0))
    text = console.export_text()
    assert "progress ▕██████████          ▏ 50%  epoch 2  ETA 0:01:00" in text
    out = io.StringIO()
    printer = PlainPrinter(out, summary_interval=0.0)
    printer.on_events([], state)
    printer.on_events([], state)  # unchanged: printed once
    lines = [line for line in out.getvalue().splitlines() if "progress" in line]
    assert len(lines) == 1 and lines[0].startswith("dmlctl: progress 50%  epoch 2  ETA ")


def test_a_run_without_metrics_is_told_how_to_send_some_once() -> None:
    """A Trainer script without dmlctl's callback: the dashboard's columns stay '-'."""
    from dmlctl.ui import render_dashboard
    from dmlctl.ui.progress import NO_METRICS, NO_METRICS_AFTER

    silent = dataclasses.replace(_with_progress({}), phase=Phase.RUNNING)
    later = 1000.0 + NO_METRICS_AFTER + 1

    def shown(state: RunState, now: float) -> str:
        console = Console(file=io.StringIO(), width=200)
        console.print(render_dashboard(state, now))
        return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]

    assert NO_METRICS not in shown(silent, 1010.0)  # give it time
    assert NO_METRICS in shown(silent, later) and "docs/integrations.md" in NO_METRICS
    stepping = _with_progress({0: {"loss": 1.0}})
    assert NO_METRICS not in shown(dataclasses.replace(stepping, phase=Phase.RUNNING), later)
    out = io.StringIO()
    printer = PlainPrinter(out)
    early = dataclasses.replace(silent, started_at=0.0)  # the plain view reads the wall clock
    printer.on_events([], early)
    printer.on_events([], early)
    assert out.getvalue().count(NO_METRICS) == 1
