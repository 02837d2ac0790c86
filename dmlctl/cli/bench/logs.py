"""``dmlctl bench logs``: parse the options, run :mod:`dmlctl.bench.logs`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish, running
from dmlctl.cli.bench.plot import check_plot, plot_option


def logs(
    lines: int = typer.Option(
        1_000_000, "--lines", help="Lines each of the 2 ranks prints as fast as it can."
    ),
    steps: int = typer.Option(20_000, "--steps", help="Iterations of the printing loop."),
    work_us: float = typer.Option(
        1000.0, "--work-us", help="Microseconds of compute per loop iteration."
    ),
    repeats: int = typer.Option(3, "--repeats", help="Loop runs per side (median counts)."),
    as_json: bool = JSON_TABLE,
    plot: Optional[Path] = plot_option("loop seconds of every repeat, lines/s carried"),  # noqa: UP045
) -> int:
    """Log lines/s carried to the run directory, and a printing loop's slowdown."""
    from dmlctl.bench.logs import render_logs_table, run_logs_bench

    check_plot(plot)
    report = running(
        "running the log benchmark…",
        lambda err: run_logs_bench(
            lines=lines, steps=steps, work_us=work_us, repeats=repeats, console=err
        ),
    )
    return finish("logs", report, render_logs_table, as_json, plot)
