"""``dmlctl bench sparse``: parse the options, run :mod:`dmlctl.bench.sparse`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish, kept, noted, running
from dmlctl.cli.bench.plot import check_plot, plot_option


def sparse(
    workers: int = typer.Option(2, "--workers", "-n", help="Workers sharing the parameters."),
    samples: int = typer.Option(100_000, "--samples", help="Training samples (one epoch)."),
    batch_size: int = typer.Option(4, "--batch-size", help="Updates per optimizer step."),
    repeats: int = typer.Option(3, "--repeats", help="Runs per strategy (medians count)."),
    as_json: bool = JSON_TABLE,
    plot: Optional[Path] = plot_option("samples/s of every run, the final loss"),  # noqa: UP045
) -> int:
    """cyclades against hogwild on sparse logistic regression: samples/s and loss."""
    from dmlctl.bench.sparse import (
        check_options,
        render_sparse_table,
        run_sparse_bench,
        sparse_json,
    )
    from dmlctl.spec import default_cluster

    check_options(workers, samples, batch_size, repeats)
    check_plot(plot)
    runs, note = running(
        "running the sparse benchmark…",
        lambda err: kept(
            lambda: run_sparse_bench(
                workers=workers,
                samples=samples,
                batch_size=batch_size,
                repeats=repeats,
                console=err,
                cluster=default_cluster(),
            )
        ),
    )
    figures = sparse_json(runs, workers=workers, samples=samples, batch_size=batch_size)
    report = noted(figures, note)
    said = f"runs {', '.join(report['run_ids'])}"
    return finish("sparse", report, render_sparse_table, as_json, plot, runs=said)
