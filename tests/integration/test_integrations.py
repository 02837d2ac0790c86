"""A Hugging Face Trainer, a LightningModule and an accelerate loop, each tiny (models
built from a config, no download, CPU, a few steps), run unchanged but for dmlctl's
callback, logger or tracker: what each library logs reaches the dashboard's columns,
``status`` and ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Cli

JOBS = Path(__file__).parent / "jobs"
pytestmark = pytest.mark.integration


def _run(cli: Cli, job: str) -> tuple[dict[str, object], list[dict[str, object]], str]:
    """Launch ``jobs/<job>``; its state, its metric records and ``status`` of it."""
    proc = cli.run("launch", str(JOBS / job / "job.yaml"), "--ui", "plain", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = cli.runs()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    status = cli.run("status", run.name)
    assert status.returncode == 0, status.stderr
    return cli.state(run.name), records, status.stdout


def _row(status: str, rank: int) -> dict[str, str]:
    """Rank ``rank``'s row of ``status``'s rank table, by column."""
    lines = [line.split() for line in status.splitlines()]
    names = next(words for words in lines if words[:2] == ["host", "rank"])
    row = next(words for words in lines if words[:2] == ["local", str(rank)])
    return dict(zip(names, row, strict=False))


@pytest.mark.parametrize(
    ("job", "ranks", "throughput"),
    [
        ("hf_trainer", (0, 1), True),  # every rank's Trainer calls on_log
        ("lightning_module", (0, 1), False),  # every rank's logger gets log_metrics
        ("accelerate_loop", (0,), False),  # accelerator.log runs on the main process only
    ],
)
def test_a_librarys_logs_fill_the_dashboards_columns(
    cli: Cli, job: str, ranks: tuple[int, ...], throughput: bool
) -> None:
    state, records, status = _run(cli, job)
    assert state["phase"] == "succeeded" and state["strategy"] == "none"
    for rank in ranks:
        mine = [r["values"] for r in records if r["rank"] == rank]
        assert len(mine) >= 3 and all("loss" in v for v in mine[:3]), mine
        row = _row(status, rank)
        assert row["step"] != "-" and row["loss"] != "-", (rank, status)
        assert (row["samples/s"] != "-") is throughput, (rank, status)
    if job == "hf_trainer":  # learning rate, epoch, the run's progress: from the Trainer
        values = [r["values"] for r in records if r["rank"] == 0]
        assert all("lr" in v and "epoch_float" in v for v in values[:3]), values
        assert values[-1].get("progress") == 1.0
