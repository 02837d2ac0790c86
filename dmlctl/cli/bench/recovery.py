"""``dmlctl bench recovery``: parse the options, run :mod:`dmlctl.bench.recovery`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLES, finish, kept, noted, running
from dmlctl.cli.bench.plot import check_plot, plot_option


def recovery(
    repeats: int = typer.Option(3, "--repeats", help="Failures timed per launcher (at least 1)."),
    backoff: float = typer.Option(
        0.1, "--backoff", help="dmlctl's restart backoff_initial in seconds (its default: 1.0)."
    ),
    mode: str = typer.Option(
        "full",
        "--mode",
        help="'full' (dmlctl's restart of the run vs torchrun's), or 'in_place': also a "
        "parameter-server run whose killed worker is replaced alone (restart.mode: "
        "in_place), with the other worker's steps/s around the kill.",
    ),
    strategy: str = typer.Option(
        "asgd",
        "--in-place-strategy",
        help="With --mode in_place: the strategy of the in-place run (one that can "
        "replace a worker in place: asgd, ssp, adadelay, easgd-async, sync-ps, aadmm, "
        "local-sgd, bmuf, easgd, admm).",
    ),
    as_json: bool = JSON_TABLES,
    plot: Optional[Path] = plot_option("recovery seconds of every repeat, stage times"),  # noqa: UP045
) -> int:
    """Seconds from a worker's SIGKILL to its first step after restart: dmlctl vs torchrun
    (with --mode in_place, also dmlctl replacing the worker alone)."""
    from dmlctl.bench.recovery import run_recovery_bench
    from dmlctl.bench.recovery_tables import render_recovery_tables

    check_plot(plot)
    report, note = running(
        "timing recovery under dmlctl and bare torchrun…",
        lambda err: kept(
            lambda: run_recovery_bench(
                repeats, backoff=backoff, mode=mode, strategy=strategy, console=err
            )
        ),
    )
    shown = noted(report.to_dict(), note)
    return finish("recovery", shown, lambda _: render_recovery_tables(report), as_json, plot)
