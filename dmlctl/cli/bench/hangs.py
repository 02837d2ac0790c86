"""``dmlctl bench hangs``: parse the options, run :mod:`dmlctl.bench.hangs`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish, running
from dmlctl.cli.bench.plot import check_plot, plot_option


def hangs(
    runs: int = typer.Option(20, "--runs", help="Runs per scenario."),
    scenarios: str = typer.Option(
        "all",
        "--scenarios",
        help="Comma-separated: prep, gil, compile, eval, deadlock, sigstop, or all.",
    ),
    seconds: float = typer.Option(35.0, "--seconds", help="Length of the healthy stretch."),
    skew: float = typer.Option(32.0, "--skew", help="Rank 1's extra seconds in that stretch."),
    hang_timeout: Optional[float] = typer.Option(  # noqa: UP045 - typer needs Optional
        None, "--hang-timeout", help="restart.hang_timeout of the runs; default: the job default."
    ),
    burn: bool = typer.Option(True, "--burn/--no-burn", help="Keep one core busy meanwhile."),
    as_json: bool = JSON_TABLE,
    plot: Optional[Path] = plot_option("verdicts per scenario, delays to the verdict"),  # noqa: UP045
) -> int:
    """False hang verdicts on healthy runs; delay and culprit of real hangs."""
    from dmlctl.bench.hangs import SCENARIOS, render_hang_table, run_hang_bench

    check_plot(plot)
    chosen = SCENARIOS if scenarios == "all" else tuple(s.strip() for s in scenarios.split(","))
    report = running(
        "running the hang benchmark…",
        lambda err: run_hang_bench(
            runs=runs,
            scenarios=chosen,
            seconds=seconds,
            skew=skew,
            hang_timeout=hang_timeout,
            burn=burn,
            console=err,
        ),
    )
    return finish("hangs", report, render_hang_table, as_json, plot)
