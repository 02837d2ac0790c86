"""``dmlctl bench ps``: parse the options, run :mod:`dmlctl.bench.ps`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish_run, running
from dmlctl.cli.bench.plot import check_plot, plot_option


def ps(
    workers: int = typer.Option(2, "--workers", "-n", help="Worker ranks (W)."),
    servers: int = typer.Option(1, "--servers", "-s", help="Parameter-server ranks (S)."),
    min_bytes: str = typer.Option("64K", "--min-bytes", help="Smallest gradient (e.g. 64K)."),
    max_bytes: str = typer.Option("16M", "--max-bytes", help="Largest gradient (e.g. 16M)."),
    iters: int = typer.Option(20, "--iters", help="Timed rounds / all-reduces per size."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed rounds / all-reduces per size."),
    as_json: bool = JSON_TABLE,
    plot: Optional[Path] = plot_option("bytes/s and their ratio by gradient size"),  # noqa: UP045
) -> int:
    """PS push+pull throughput against an all-reduce of the same bytes on this machine."""
    from dmlctl.bench.ps import local_bench_cluster, run_ps_bench
    from dmlctl.bench.ps_report import ps_json, ps_summary, render_ps_table
    from dmlctl.bench.report import Sweep
    from dmlctl.spec import default_cluster

    check_plot(plot)
    sweep = Sweep.parse(min_bytes, max_bytes, iters, warmup)
    spec = local_bench_cluster(default_cluster(), workers + servers)
    results, run = running(
        f"running the parameter-server benchmark ({workers} + {servers} ranks)…",
        lambda err: run_ps_bench(spec, workers=workers, servers=servers, sweep=sweep, console=err),
    )
    figures = ps_json(results, workers, servers)
    return finish_run(
        "ps",
        run.run_id,
        figures,
        lambda _: [render_ps_table(results, workers, servers), ps_summary(results)],
        as_json,
        plot,
    )
