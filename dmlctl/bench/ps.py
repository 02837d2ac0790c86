"""``dmlctl bench ps``: parameter-server push+pull against all-reduce, as a dmlctl job.

The benchmark is an ordinary run (run directory, logs, ``dmlctl status``) of
``ps_worker.py`` from this package with strategy ``ssgd`` on ``W + S`` ranks:
``W`` workers and ``S`` servers, then an all-reduce on the same ``W + S`` processes.
Definitions are in :mod:`dmlctl.bench.ps_report`. This module never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from dmlctl.bench.comm import BENCH_DIR
from dmlctl.bench.plan import announce, planned
from dmlctl.bench.ps_report import PsResult, parse_ps_metrics
from dmlctl.bench.report import Sweep
from dmlctl.bench.runs import NO_RESTARTS, BenchFailed, launch_bench, metric_lines
from dmlctl.errors import UsageError
from dmlctl.launch.api import LaunchResult
from dmlctl.spec.models import ClusterSpec, JobSpec, StrategySpec

WORKER_SCRIPT = "ps_worker.py"
JOB_NAME = "bench-ps"

__all__ = ["BenchFailed", "local_bench_cluster", "ps_job", "run_ps_bench"]


def ps_job(*, workers: int, servers: int, sweep: Sweep) -> JobSpec:
    """The job spec of one benchmark run over ``sweep`` on ``workers + servers``
    ranks (validates the options; no I/O). No restarts: a restarted attempt would mix
    two measurements.

    Raises :class:`UsageError` for ``workers < 1``, ``servers < 1`` or a smallest
    size below 4 bytes per server.
    """
    if workers < 1 or servers < 1:
        raise UsageError(f"need --workers >= 1 and --servers >= 1, got {workers} and {servers}")
    if sweep.min_bytes < 4 * servers:
        raise UsageError(
            f"--min-bytes must give every server at least one float32 (>= {4 * servers} bytes "
            f"for {servers} servers), got {sweep.min_bytes}"
        )
    return JobSpec(
        name=JOB_NAME,
        script=WORKER_SCRIPT,
        args=["--servers", str(servers), *sweep.args()],
        workers=workers + servers,
        workdir=str(BENCH_DIR),
        strategy=StrategySpec(name="ssgd"),
        restart=NO_RESTARTS,
    )


def local_bench_cluster(cluster: ClusterSpec, ranks: int) -> ClusterSpec:
    """``cluster`` (the default one: this machine, one host) with at least ``ranks``
    slots on its host, so ``W + S`` ranks fit even on a machine with fewer cores
    (oversubscribed: servers mostly wait). Other clusters are returned unchanged."""
    if len(cluster.hosts) != 1 or cluster.total_slots >= ranks:
        return cluster
    host = cluster.hosts[0].model_copy(update={"slots": ranks})
    return cluster.model_copy(update={"hosts": [host]})


STARTUP_S = 3.5
"""About what the run takes besides its rounds (launch, start-up, exit) on 2 cores."""
BYTES_PER_S = 4e8
"""About the bytes per second a round (push and pull) or an all-reduce moves per worker."""


def plan(workers: int, sweep: Sweep) -> str:
    """The one run :func:`run_ps_bench` makes, and about how long it takes (every size
    pushed and pulled, then all-reduced, by every worker)."""
    moved = sweep.bytes_moved() * 2
    return planned(1, "", STARTUP_S + moved * max(1, workers) / 2 / BYTES_PER_S)


def run_ps_bench(
    cluster: ClusterSpec,
    *,
    workers: int,
    servers: int,
    sweep: Sweep,
    console: Console,
    home: Path | None = None,
) -> tuple[list[PsResult], LaunchResult]:
    """Run the benchmark on ``cluster`` and return one result per size (sorted).

    Blocks until the run ends. Raises :class:`UsageError` for bad options (before
    launching) and :class:`BenchFailed` naming the root cause if the run failed, or
    succeeded without a result for every size of the sweep.
    """
    announce(console, "ps", plan(workers, sweep))
    job = ps_job(workers=workers, servers=servers, sweep=sweep)
    result = launch_bench(job, cluster, console=console, home=home)
    results = parse_ps_metrics(metric_lines(result))
    got = {r.bytes for r in results}
    missing = [size for size in sweep.sizes if size // 4 * 4 not in got]
    if missing:
        raise BenchFailed(
            f"benchmark run {result.run_id} succeeded but reported no result for "
            f"{len(missing)} of {len(sweep.sizes)} sizes; see `dmlctl logs {result.run_id}`"
        )
    return results, result
