"""``dmlctl bench parallel``: parse the options, run :mod:`dmlctl.bench.parallel`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish, running, whole_or_partial
from dmlctl.cli.bench.plot import check_plot, plot_option


def parallel(
    steps: int = typer.Option(
        16, "--steps", help="Steps per run, the first 3 untimed (at least 5)."
    ),
    layouts: str = typer.Option(
        "all",
        "--layouts",
        help="Comma-separated: dp4 (the baseline), tp2-dp2, tp4, pp4-gpipe, pp4-1f1b, "
        "fsdp4, pp2-tp2, or all.",
    ),
    repeats: int = typer.Option(2, "--repeats", help="Runs per layout (medians count)."),
    as_json: bool = JSON_TABLE,
    plot: Optional[Path] = plot_option("memory per rank and samples/s by layout"),  # noqa: UP045
) -> int:
    """Memory per rank and samples/s of the example transformer under tensor, pipeline
    and FSDP layouts on 4 workers, against plain data parallelism."""
    from dmlctl.bench.parallel import check_options, parse_layouts, run_parallel_bench
    from dmlctl.bench.parallel_report import render_parallel_table

    chosen = parse_layouts(layouts)
    check_options(steps, repeats)
    check_plot(plot)
    report = running(
        "running the parallelism benchmark…",
        lambda err: whole_or_partial(
            lambda: run_parallel_bench(chosen, steps=steps, repeats=repeats, console=err)
        ),
    )
    return finish("parallel", report, render_parallel_table, as_json, plot)
