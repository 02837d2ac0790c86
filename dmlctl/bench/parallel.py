"""``dmlctl bench parallel``: what each model-parallel layout costs and saves.

The example transformer (``parallel_job/model.py``, 3.3M parameters) trains with
AdamW under each layout of :data:`LAYOUTS` on 4 local workers — plain data
parallelism (``ssgd`` over DDP, the baseline), tensor × data, tensor, pipeline
(GPipe, 1F1B), FSDP2 and pipeline × tensor — each run an ordinary ``dmlctl launch``
of a generated job file (:func:`job_spec`) with ``parallel_job/train.py``, in a
temporary ``DMLCTL_HOME``. Every layout trains on the same global batch per step
(:data:`GLOBAL_BATCH`, split over its data-parallel replicas). Rounds alternate
through the layouts ``repeats`` times, so every layout meets the same machine load;
a run that fails (on an overloaded machine the controller can lose a host agent) is
launched once more, from scratch, and listed in the report's ``failed_runs``.

From each run's ``metrics.jsonl`` (:mod:`dmlctl.bench.parallel_report` reads and
reduces them): every rank's parameter and optimizer bytes after the first step,
and ``samples_per_s`` over the timed steps. This module never imports torch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from dmlctl.bench.parallel_report import RunFigures, parallel_json, run_figures
from dmlctl.bench.plan import announce, planned
from dmlctl.bench.ps import local_bench_cluster
from dmlctl.bench.runs import (
    BenchFailed,
    BenchPartial,
    Launcher,
    alternate,
    launch_bench,
    metric_lines,
)
from dmlctl.bench.strategies import write_job
from dmlctl.errors import UsageError
from dmlctl.launch.api import launch
from dmlctl.spec import default_cluster, load_job
from dmlctl.spec.models import JobSpec
from dmlctl.text import plural

JOB_DIR = Path(__file__).resolve().parent / "parallel_job"
WORKERS = 4
WARMUP_STEPS = 3
MIN_STEPS = WARMUP_STEPS + 2
GLOBAL_BATCH = 32  # windows of 64 bytes per step, whatever the layout
BASELINE = "dp4"


@dataclass(frozen=True)
class Layout:
    """One measured layout: its job's ``parallelism:`` block (None: plain ssgd, a
    whole replica per worker) and the goals its report row is checked against
    (measure of the row → upper bound)."""

    name: str
    title: str
    parallelism: Mapping[str, Any] | None = None
    goals: Mapping[str, float] = field(default_factory=dict)


def _pipeline(degree: int, schedule: str, microbatches: int) -> dict[str, Any]:
    return {
        "pipeline_parallel_degree": degree,
        "pipeline_parallel_schedule": schedule,
        "pipeline_parallel_microbatches": microbatches,
    }


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout(BASELINE, "data parallel, 4 replicas (ssgd, DDP)"),
        Layout(
            "tp2-dp2",
            "tensor 2 × data 2",
            {"tensor_parallel_degree": 2, "data_parallel_replicate_degree": 2},
            {"sharded_ratio": 0.55},
        ),
        Layout("tp4", "tensor 4", {"tensor_parallel_degree": 4}),
        Layout("pp4-gpipe", "pipeline 4, GPipe, 8 microbatches", _pipeline(4, "GPipe", 8)),
        Layout("pp4-1f1b", "pipeline 4, 1F1B, 8 microbatches", _pipeline(4, "1F1B", 8)),
        Layout("fsdp4", "FSDP2 over 4", {"data_parallel_shard_degree": 4}, {"memory_ratio": 0.3}),
        Layout(
            "pp2-tp2",
            "pipeline 2 (1F1B, 4 microbatches) × tensor 2",
            {**_pipeline(2, "1F1B", 4), "tensor_parallel_degree": 2},
        ),
    )
}
"""Every layout, by the name ``--layouts`` takes, in the report's order."""


def parse_layouts(text: str) -> list[str]:
    """``--layouts``: ``all`` or a comma-separated subset of :data:`LAYOUTS`, in
    their order; UsageError naming the unknown ones and the valid names."""
    asked = [s.strip() for s in text.split(",") if s.strip()]
    if asked == ["all"]:
        return list(LAYOUTS)
    unknown = [s for s in asked if s not in LAYOUTS]
    if unknown or not asked:
        what = f"unknown {', '.join(unknown)}" if unknown else "no layout named"
        raise UsageError(f"--layouts: {what}; choose from {', '.join(LAYOUTS)}, or all")
    return [name for name in LAYOUTS if name in asked]


def check_options(steps: int, repeats: int) -> None:
    """UsageError for fewer than :data:`MIN_STEPS` steps or fewer than 1 repeat."""
    if steps < MIN_STEPS:
        raise UsageError(
            f"--steps must be at least {MIN_STEPS} ({WARMUP_STEPS} untimed + 2), got {steps}"
        )
    if repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {repeats}")


def job_spec(layout: Layout, steps: int) -> dict[str, Any]:
    """The job file (as a mapping) of ``layout`` with ``steps`` steps; restarts off (a
    restarted attempt would mix two measurements)."""
    spec: dict[str, Any] = {
        "name": f"bench-parallel-{layout.name}",
        "script": "train.py",
        "args": [
            *("--steps", str(steps), "--warmup", str(WARMUP_STEPS)),
            *("--batch-size", str(GLOBAL_BATCH)),
        ],
        "workdir": str(JOB_DIR),
        "workers": WORKERS,
        "strategy": "ssgd",
        "env": {"OMP_NUM_THREADS": "1"},
        "restart": {"max_user_restarts": 0, "max_infra_restarts": 0},
    }
    if layout.parallelism is not None:
        spec["parallelism"] = dict(layout.parallelism)
    return spec


class _Runner:
    """Launches the layouts' jobs into one temporary home, each run measured whole:
    a run that fails is launched once more from scratch (restarts are off, so two
    attempts never mix in one measurement), and the failure is kept for the report."""

    def __init__(self, tmp: Path, console: Console, launcher: Launcher) -> None:
        self.dir, self.home, self.console, self.launcher = tmp, tmp / "home", console, launcher
        self.cluster = local_bench_cluster(default_cluster(), WORKERS)
        self.failures: list[str] = []

    def measure(self, layout: Layout, steps: int) -> RunFigures:
        """One run of ``layout``'s job (two at most); BenchFailed when both fail."""
        job = load_job(write_job(job_spec(layout, steps), self.dir))
        try:
            return self._once(job)
        except BenchFailed as exc:
            self.failures.append(str(exc))
            self.console.print(f"{exc}; launching {layout.name} once more", markup=False)
        return self._once(job)

    def _once(self, job: JobSpec) -> RunFigures:
        result = launch_bench(
            job, self.cluster, console=self.console, home=self.home, launcher=self.launcher
        )
        return run_figures(result.run_id, metric_lines(result), WORKERS)


STARTUP_S = 6.0
"""About what a run takes besides its steps (launch, 4 ranks' start-up, exit) on 2 cores."""
STEP_S = 0.25
"""About one step of a layout on 2 cores (4 ranks)."""


def plan(names: Sequence[str], steps: int, repeats: int) -> str:
    """The runs :func:`run_parallel_bench` makes, and about how long they take."""
    why = f"{plural(len(names), 'layout')} × {repeats}"
    return planned(len(names) * repeats, why, STARTUP_S + steps * STEP_S)


def run_parallel_bench(
    names: Sequence[str],
    *,
    steps: int,
    repeats: int,
    console: Console,
    launcher: Launcher = launch,
) -> dict[str, Any]:
    """Run every layout of ``names`` ``repeats`` times (rounds alternate through the
    layouts) and return the report (:func:`~dmlctl.bench.parallel_report.parallel_json`,
    with ``failed_runs``: the runs launched once more). Raises UsageError for bad
    options before launching, :class:`~dmlctl.bench.runs.BenchFailed` naming a run
    that failed twice in a row or logged an incomplete record, and, for a Ctrl-C after
    a whole round, :class:`~dmlctl.bench.runs.BenchPartial` with the report of the
    whole rounds (``partial`` in it says how much ran)."""
    check_options(steps, repeats)
    announce(console, "parallel", plan(names, steps, repeats))
    with tempfile.TemporaryDirectory(prefix="dmlctl-bench-parallel-") as tmp:
        runner = _Runner(Path(tmp), console, launcher)
        runs, note = alternate(
            names, repeats, lambda name, _: runner.measure(LAYOUTS[name], steps), console
        )
    report = parallel_json(
        {name: (LAYOUTS[name].title, LAYOUTS[name].goals) for name in names},
        runs,
        baseline=BASELINE,
        setup={
            "workers": WORKERS,
            "steps": steps,
            "warmup_steps": WARMUP_STEPS,
            "global_batch": GLOBAL_BATCH,
            "repeats": repeats,
            "failed_runs": runner.failures,
        },
    )
    if note is not None:
        raise BenchPartial(note, {**report, "partial": note})
    return report
