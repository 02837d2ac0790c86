"""``dmlctl bench comm``: parse the options, run :mod:`dmlctl.bench.comm`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLE, finish_run, running
from dmlctl.cli.bench.plot import check_plot, plot_option
from dmlctl.cli.common import CLUSTER_OPTION, no_slurm


def comm(
    cluster: Optional[Path] = CLUSTER_OPTION,  # noqa: UP045 - typer needs both
    workers: Optional[int] = typer.Option(  # noqa: UP045
        None, "--workers", "-n", help="Number of ranks; default: every slot of the cluster."
    ),
    ops: str = typer.Option(
        "allreduce,allgather,broadcast", "--ops", help="Comma-separated collectives."
    ),
    min_bytes: str = typer.Option("1K", "--min-bytes", help="Smallest message (e.g. 1K)."),
    max_bytes: str = typer.Option("16M", "--max-bytes", help="Largest message (e.g. 16M)."),
    iters: int = typer.Option(20, "--iters", help="Timed calls per size."),
    warmup: int = typer.Option(5, "--warmup", help="Untimed calls per size before timing."),
    as_json: bool = JSON_TABLE,
    plot: Optional[Path] = plot_option("bus bandwidth against message size"),  # noqa: UP045
) -> int:
    """Measure allreduce / allgather / broadcast time and bus bandwidth (nccl-tests style)."""
    from dmlctl.bench.comm import run_comm_bench
    from dmlctl.bench.report import Sweep, comm_json, parse_ops, render_comm_table
    from dmlctl.spec import default_cluster, load_cluster_file

    check_plot(plot)
    op_names = parse_ops(ops)
    sweep = Sweep.parse(min_bytes, max_bytes, iters, warmup)
    spec = (
        no_slurm(load_cluster_file(cluster), "bench comm", cluster)
        if cluster is not None
        else default_cluster()
    )
    results, run = running(
        "running the communication benchmark…",
        lambda err: run_comm_bench(spec, workers=workers, ops=op_names, sweep=sweep, console=err),
    )
    world = run.state.world_size if run.state is not None else (workers or spec.total_slots)
    figures = comm_json(results, world)
    return finish_run(
        "comm", run.run_id, figures, lambda _: render_comm_table(results, world), as_json, plot
    )
