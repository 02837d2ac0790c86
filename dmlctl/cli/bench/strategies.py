"""``dmlctl bench strategies``: parse the options, run :mod:`dmlctl.bench.strategies`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLES, finish, running, whole_or_partial
from dmlctl.cli.bench.plot import check_plot, plot_option


def strategies(
    steps: int = typer.Option(400, "--steps", help="Steps per run: 48 warm-up + a multiple of 8."),
    repeats: int = typer.Option(
        3, "--repeats", help="Runs per side for throughput and overlap (at least 3)."
    ),
    sections: str = typer.Option(
        "throughput,bytes,filters,overlap",
        "--sections",
        help="Comma-separated: throughput (dmlctl vs hand-written DDP), bytes (ssgd "
        "compressions), filters (model and push filters), overlap (asynchronous strategies).",
    ),
    as_json: bool = JSON_TABLES,
    plot: Optional[Path] = plot_option("samples/s of every run, bytes/step by strategy"),  # noqa: UP045
) -> int:
    """Overhead against hand-written DDP, bytes/step of every compression and filter,
    and overlap's throughput ratio."""
    from dmlctl.bench.strategies import parse_sections, run_strategy_bench
    from dmlctl.bench.strategies_report import render_strategies_table

    check_plot(plot)
    chosen = parse_sections(sections)
    report = running(
        "running the strategy benchmark…",
        lambda err: whole_or_partial(
            lambda: run_strategy_bench(steps, repeats, console=err, sections=chosen)
        ),
    )
    return finish("strategies", report, render_strategies_table, as_json, plot)
