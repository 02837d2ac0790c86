"""``dmlctl bench launch``: parse the options, run :mod:`dmlctl.bench.launch_overhead`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish, running, whole_or_partial
from dmlctl.cli.bench.plot import check_plot, plot_option


def launch(
    repeats: int = typer.Option(5, "--repeats", help="Timed runs per launcher (at least 5)."),
    workers: int = typer.Option(2, "--workers", "-n", help="Local workers per run."),
    ranks: str = typer.Option(
        "fresh", "--ranks", help="How dmlctl's ranks start: fresh (the default) or warm."
    ),
    no_server: bool = typer.Option(
        False,
        "--no-server",
        help="Launch without the agent server (each launch starts its agent and imports torch).",
    ),
    as_json: bool = JSON_TABLE,
    plot: Optional[Path] = plot_option("seconds per launch, every repeat"),  # noqa: UP045
) -> int:
    """Compare `dmlctl launch` with bare torchrun on a trivial job; print the ratio."""
    from dmlctl.bench.launch_overhead import render_launch_table, run_launch_bench

    check_plot(plot)
    report = running(
        "timing dmlctl launch against bare torchrun…",
        lambda err: whole_or_partial(
            lambda: run_launch_bench(
                repeats, workers, console=err, start=ranks, server=not no_server
            )
        ),
    )
    return finish("launch", report, render_launch_table, as_json, plot)
