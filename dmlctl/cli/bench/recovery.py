"""``dmlctl bench recovery``: parse the options, run :mod:`dmlctl.bench.recovery`, print
its result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLES, ended
from dmlctl.cli.bench.plot import check_plot, plot_option, write_plot
from dmlctl.cli.common import stderr_console, stdout_console


def recovery(
    repeats: int = typer.Option(3, "--repeats", help="Failures timed per launcher (at least 1)."),
    backoff: float = typer.Option(
        0.1, "--backoff", help="dmlctl's restart backoff_initial in seconds (its default: 1.0)."
    ),
    as_json: bool = JSON_TABLES,
    plot: Optional[Path] = plot_option("recovery seconds of every repeat, stage times"),  # noqa: UP045
) -> int:
    """Seconds from a worker's SIGKILL to its first step after restart: dmlctl vs torchrun."""
    from dmlctl.bench.recovery import render_recovery_tables, run_recovery_bench
    from dmlctl.bench.runs import BenchPartial

    check_plot(plot)
    err = stderr_console()
    note = None
    with err.status("timing recovery under dmlctl and bare torchrun…"):
        try:
            report = run_recovery_bench(repeats, backoff=backoff, console=err)
        except BenchPartial as stop:
            report, note = stop.result, stop.note
    if as_json:
        print(json.dumps({**report.to_dict(), **({"partial": note} if note else {})}, indent=2))
    else:
        for table in render_recovery_tables(report):
            stdout_console().print(table)
    write_plot("recovery", report.to_dict(), plot)
    return ended(err, note)
