"""``dmlctl bench sparse`` without ranks: the jobs it launches, what it reads back from
each run, the report and its table, and bad options (a fake launcher writes the
metrics a real run would)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dmlctl.bench.runs import BenchFailed
from dmlctl.bench.sparse import (
    SparseRun,
    parse_run,
    render_sparse_table,
    run_sparse_bench,
    sparse_job,
    sparse_json,
)
from dmlctl.errors import UsageError
from dmlctl.launch.api import LaunchResult
from dmlctl.spec import default_cluster


class FakeLauncher:
    """Writes a ``bench="sparse"`` record per run: hogwild 30k samples/s, cyclades 24k."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.jobs: list[Any] = []

    def __call__(self, job: Any, cluster: Any, *, options: Any, console: Any) -> LaunchResult:
        self.jobs.append(job)
        run_dir = self.root / f"run{len(self.jobs)}"
        run_dir.mkdir(parents=True)
        rate = 30_000.0 if job.strategy.name == "hogwild" else 24_000.0 + len(self.jobs)
        values = {"bench": "sparse", "samples_per_s": rate, "train_loss": 0.3, "test_acc": 0.86}
        (run_dir / "metrics.jsonl").write_text(json.dumps({"rank": 0, "values": values}) + "\n")
        return LaunchResult(run_dir.name, run_dir, None, 0)


def test_runs_alternate_the_strategies_on_one_host(tmp_path: Path) -> None:
    fake = FakeLauncher(tmp_path)
    runs = run_sparse_bench(
        workers=2,
        samples=5_000,
        batch_size=4,
        repeats=2,
        console=Console(quiet=True),
        cluster=default_cluster(),
        launcher=fake,
    )
    assert [r.strategy for r in runs] == ["hogwild", "cyclades"] * 2
    assert all(j.max_hosts == 1 and j.workers == 2 for j in fake.jobs)
    assert fake.jobs[0].args == ["--samples", "5000", "--batch-size", "4"]
    report = sparse_json(runs, workers=2, samples=5_000, batch_size=4)
    assert report["repeats"] == 2
    assert report["strategies"]["cyclades"]["samples_per_s"]["samples"] == [24_002.0, 24_004.0]
    assert report["ratio"] == pytest.approx(24_003.0 / 30_000.0)
    table = Console(width=120, record=True)
    table.print(render_sparse_table(report))
    text = table.export_text()
    assert "cyclades / hogwild samples/s: 0.800" in text and "24,003" in text


def test_a_run_without_its_record_fails_naming_it() -> None:
    with pytest.raises(BenchFailed, match="run r1 logged no result"):
        parse_run("cyclades", "r1", ['{"values": {"bench": "sparse", "samples_per_s": 1}}'])
    run = parse_run(
        "hogwild",
        "r2",
        ['{"values": {"bench": "sparse", "samples_per_s": 2, "train_loss": 0.5, "test_acc": 0.8}}'],
    )
    assert run == SparseRun("hogwild", "r2", 2.0, 0.5, 0.8)


@pytest.mark.parametrize(
    ("workers", "samples", "batch", "repeats", "message"),
    [(1, 5_000, 4, 1, "--workers"), (2, 10, 4, 1, "--samples"), (2, 5_000, 0, 1, "--batch-size")],
)
def test_bad_options_are_usage_errors(
    workers: int, samples: int, batch: int, repeats: int, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        run_sparse_bench(
            workers=workers,
            samples=samples,
            batch_size=batch,
            repeats=repeats,
            console=Console(quiet=True),
            cluster=default_cluster(),
        )


def test_the_job_is_the_packaged_script_without_restarts() -> None:
    job = sparse_job("cyclades", workers=3, samples=2_000, batch_size=1)
    assert job.script == "train.py" and Path(job.workdir, "train.py").is_file()
    assert job.strategy.name == "cyclades" and job.restart.max_user_restarts == 0
