"""``dmlctl bench sparse``: cyclades against hogwild on a sparse problem.

Each run is an ordinary dmlctl launch (``--ui quiet``) of ``sparse_job/train.py`` on
this machine: sparse logistic regression (``--samples`` samples, 10 of 20,000
features active, plain SGD, ``--batch-size`` updates per step), the same data and the
same number of updates under both strategies, ``--workers`` workers sharing the
parameters in memory. The first worker logs ``samples_per_s`` (every sample over the
wall time from a barrier before the loop to the end of ``ctx.shard``), the final
``train_loss`` on the whole training set and ``test_acc``. Reported per strategy:
the median over ``--repeats`` runs, and **ratio** = cyclades' median samples/s over
hogwild's. This module never imports torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dmlctl.bench.plan import announce, planned
from dmlctl.bench.ps import local_bench_cluster
from dmlctl.bench.report import metric_values
from dmlctl.bench.runs import (
    NO_RESTARTS,
    BenchFailed,
    BenchPartial,
    Launcher,
    alternate,
    launch_bench,
    metric_lines,
)
from dmlctl.errors import UsageError
from dmlctl.launch.api import launch
from dmlctl.spec.models import ClusterSpec, JobSpec, StrategySpec

JOB_DIR = Path(__file__).resolve().parent / "sparse_job"
STRATEGIES = ("hogwild", "cyclades")
MEASURES = ("samples_per_s", "train_loss", "test_acc")


@dataclass(frozen=True)
class SparseRun:
    """One run's figures (the first worker's record)."""

    strategy: str
    run_id: str
    samples_per_s: float
    train_loss: float
    test_acc: float


def check_options(workers: int, samples: int, batch_size: int, repeats: int) -> None:
    """UsageError for fewer than 2 workers, fewer than 1,000 samples, or a batch size
    or repeat count below 1."""
    if workers < 2:
        raise UsageError(f"--workers must be at least 2, got {workers}")
    if samples < 1_000:
        raise UsageError(f"--samples must be at least 1000, got {samples}")
    if batch_size < 1 or repeats < 1:
        raise UsageError(
            f"--batch-size and --repeats must be at least 1, got {batch_size}, {repeats}"
        )


def sparse_job(strategy: str, *, workers: int, samples: int, batch_size: int) -> JobSpec:
    """The job of one run (no I/O), restarts off (a restart would mix two timings)."""
    return JobSpec(
        name=f"bench-sparse-{strategy}",
        script="train.py",
        args=["--samples", str(samples), "--batch-size", str(batch_size)],
        workers=workers,
        max_hosts=1,
        workdir=str(JOB_DIR),
        strategy=StrategySpec.model_validate({"name": strategy}),
        env={"OMP_NUM_THREADS": "1"},
        restart=NO_RESTARTS,
    )


def parse_run(strategy: str, run_id: str, lines: Iterable[str]) -> SparseRun:
    """The run's ``bench="sparse"`` record; BenchFailed naming the run without one."""
    for values in metric_values(lines):
        if values.get("bench") == "sparse" and all(
            isinstance(values.get(k), int | float) for k in MEASURES
        ):
            return SparseRun(strategy, run_id, *(float(values[k]) for k in MEASURES))
    raise BenchFailed(f"benchmark run {run_id} logged no result; see `dmlctl logs {run_id}`")


STARTUP_S = 4.0
"""About what a run takes besides its samples (launch, start-up, exit) on 2 cores."""
SAMPLE_S = 3.5e-5
"""About the seconds per training sample of either strategy on 2 workers, 2 cores."""


def plan(workers: int, samples: int, repeats: int) -> str:
    """The runs :func:`run_sparse_bench` makes, and about how long they take."""
    each = STARTUP_S + samples * SAMPLE_S * 2 / max(1, min(workers, 2))
    return planned(len(STRATEGIES) * repeats, f"{repeats} × {len(STRATEGIES)} strategies", each)


def run_sparse_bench(
    *,
    workers: int,
    samples: int,
    batch_size: int,
    repeats: int,
    console: Console,
    cluster: ClusterSpec,
    home: Path | None = None,
    launcher: Launcher = launch,
) -> list[SparseRun]:
    """Alternate hogwild and cyclades runs ``repeats`` times (so both meet the same
    machine load); every run's figures, in order. Raises UsageError for bad options,
    BenchFailed naming a run that failed or logged nothing, and, for a Ctrl-C after a
    whole repeat, :class:`BenchPartial` with the whole repeats' runs."""
    check_options(workers, samples, batch_size, repeats)
    announce(console, "sparse", plan(workers, samples, repeats))
    where = local_bench_cluster(cluster, workers)

    def one(strategy: str, _round: int) -> SparseRun:
        job = sparse_job(strategy, workers=workers, samples=samples, batch_size=batch_size)
        result = launch_bench(job, where, console=console, home=home, launcher=launcher)
        return parse_run(strategy, result.run_id, metric_lines(result))

    runs, note = alternate(STRATEGIES, repeats, one, console)
    out = [run for round_ in zip(*runs.values(), strict=True) for run in round_]
    if note is not None:
        raise BenchPartial(note, out)
    return out


def _summary(values: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "samples": list(values)}


def sparse_json(
    runs: Sequence[SparseRun], *, workers: int, samples: int, batch_size: int
) -> dict[str, Any]:
    """The report ``--json`` prints: per strategy the median and every run of each
    measure, and the throughput ratio cyclades / hogwild."""
    per: dict[str, dict[str, Any]] = {}
    for name in STRATEGIES:
        mine = [r for r in runs if r.strategy == name]
        if mine:
            per[name] = {k: _summary([getattr(r, k) for r in mine]) for k in MEASURES}
    ratio = None
    if len(per) == len(STRATEGIES):
        rates = [per[n]["samples_per_s"]["median"] for n in STRATEGIES]
        ratio = rates[1] / rates[0] if rates[0] > 0 else None
    return {
        "workers": workers,
        "samples": samples,
        "batch_size": batch_size,
        "repeats": max((len(v["samples_per_s"]["samples"]) for v in per.values()), default=0),
        "strategies": per,
        "ratio": ratio,
        "run_ids": [r.run_id for r in runs],
    }


def render_sparse_table(report: Mapping[str, Any]) -> Table:
    """One row per strategy (medians), the ratio in the caption."""
    title = (
        f"sparse logistic regression: {report['samples']:,} samples, {report['workers']} "
        f"workers, {report['batch_size']} updates per step, {report['repeats']} runs each"
    )
    table = Table(title=title, title_justify="left")
    for header in ("strategy", "samples/s", "train loss", "test accuracy"):
        table.add_column(header, justify="left" if header == "strategy" else "right")
    for name, row in report["strategies"].items():
        table.add_row(
            name,
            f"{row['samples_per_s']['median']:,.0f}",
            f"{row['train_loss']['median']:.4f}",
            f"{row['test_acc']['median']:.4f}",
        )
    if report["ratio"] is not None:
        table.caption = f"cyclades / hogwild samples/s: {report['ratio']:.3f}"
        table.caption_justify = "left"
    return table
