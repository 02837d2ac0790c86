"""``dmlctl bench comm``: run the collective benchmark as an ordinary dmlctl job.

The benchmark is a real run (run directory, logs, ``dmlctl status``) of
``comm_worker.py`` from this package, so it measures exactly the process layout,
rendezvous and network path a training job gets. This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from dmlctl.bench.plan import announce, planned
from dmlctl.bench.report import OPS, CommResult, Sweep, parse_metrics
from dmlctl.bench.runs import BenchFailed, launch_bench, metric_lines
from dmlctl.errors import UsageError
from dmlctl.launch.api import LaunchResult
from dmlctl.spec.models import ClusterSpec, JobSpec

BENCH_DIR = Path(__file__).resolve().parent
"""The job's workdir: this package directory (shipped to every host)."""

WORKER_SCRIPT = "comm_worker.py"
JOB_NAME = "bench-comm"


__all__ = ["BENCH_DIR", "BenchFailed", "comm_job", "run_comm_bench"]


def comm_job(*, workers: int | None, ops: Sequence[str], sweep: Sweep) -> JobSpec:
    """The job spec of one benchmark run of ``ops`` over ``sweep`` (validates the
    options; no I/O).

    Raises :class:`UsageError` for unknown ops or ``workers < 1``.
    """
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise UsageError(f"unknown op(s) {', '.join(unknown) or '(none)'}; valid: {', '.join(OPS)}")
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    args = ["--ops", ",".join(ops), *sweep.args()]
    return JobSpec(
        name=JOB_NAME, script=WORKER_SCRIPT, args=args, workers=workers, workdir=str(BENCH_DIR)
    )


STARTUP_S = 3.5
"""About what the run takes besides its collectives (launch, start-up, exit) on 2 cores."""
BYTES_PER_S = 5.5e8
"""About the bytes per second one collective call moves per rank on 2 cores."""


def plan(ops: Sequence[str], sweep: Sweep) -> str:
    """The one run :func:`run_comm_bench` makes, and about how long it takes."""
    return planned(1, "", STARTUP_S + sweep.bytes_moved() * len(ops) / BYTES_PER_S)


def run_comm_bench(
    cluster: ClusterSpec,
    *,
    workers: int | None,
    ops: Sequence[str],
    sweep: Sweep,
    console: Console,
    home: Path | None = None,
) -> tuple[list[CommResult], LaunchResult]:
    """Run the benchmark on ``cluster`` and return its results (sorted by op, size).

    Blocks until the run ends. Raises :class:`BenchFailed` naming the root cause if
    the run did not succeed, or if it succeeded without results for every op.
    """
    announce(console, "comm", plan(ops, sweep))
    job = comm_job(workers=workers, ops=ops, sweep=sweep)
    result = launch_bench(job, cluster, console=console, home=home)
    results = parse_metrics(metric_lines(result))
    missing = [op for op in ops if not any(r.op == op for r in results)]
    if missing:
        raise BenchFailed(
            f"benchmark run {result.run_id} succeeded but reported no results for "
            f"{', '.join(missing)}; see `dmlctl logs {result.run_id}`"
        )
    return results, result
