"""``dmlctl bench recovery``: parse the options, run :mod:`dmlctl.bench.recovery`, print
its result."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from dmlctl.cli.bench.common import JSON_TABLES, finish, kept, noted, running
from dmlctl.cli.bench.plot import check_plot, plot_option

if TYPE_CHECKING:
    from dmlctl.spec import ClusterSpec


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
        "local-sgd, bmuf, easgd, admm, ssgd, dpsgd).",
    ),
    ranks: str = typer.Option(
        "fresh", "--ranks", help="How dmlctl's ranks start: fresh (the default) or warm."
    ),
    cluster: Optional[Path] = typer.Option(  # noqa: UP045 - typer needs both
        None,
        "--cluster",
        "-c",
        help="Run dmlctl's sides on this cluster file (its hosts must see this "
        "machine's files, as the lab's do: `dmlctl lab up`); bare torchrun runs here. "
        "Default: this machine.",
    ),
    as_json: bool = JSON_TABLES,
    plot: Optional[Path] = plot_option("recovery seconds of every repeat, stage times"),  # noqa: UP045
) -> int:
    """Seconds from a worker's SIGKILL to its first step after restart: dmlctl vs torchrun
    (with --mode in_place, also dmlctl replacing the worker alone)."""
    from dmlctl.bench.recovery import run_recovery_bench
    from dmlctl.bench.recovery_tables import render_recovery_tables

    check_plot(plot)
    spec = _cluster(cluster)
    report, note = running(
        "timing recovery under dmlctl and bare torchrun…",
        lambda err: kept(
            lambda: run_recovery_bench(
                repeats,
                backoff=backoff,
                mode=mode,
                strategy=strategy,
                console=err,
                cluster=spec,
                ranks=ranks,
            )
        ),
    )
    shown = noted(report.to_dict(), note)
    return finish("recovery", shown, lambda _: render_recovery_tables(report), as_json, plot)


def _cluster(path: Path | None) -> ClusterSpec | None:
    """The cluster file at ``path`` (None: this machine); not a Slurm one."""
    if path is None:
        return None
    from dmlctl.cli.common import no_slurm
    from dmlctl.spec import load_cluster_file

    spec = load_cluster_file(path)
    no_slurm(spec, "bench recovery", path)
    return spec
