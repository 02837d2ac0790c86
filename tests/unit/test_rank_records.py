"""A rank's records have one writer per process (issue 28, "one writer per rank
file"): its entry point's start, heartbeats and exit and its metrics go through the
same open file under one lock, and the metrics' close never closes it under the exit
record (real files)."""

from __future__ import annotations

import json
from pathlib import Path

from dmlctl import protocol
from dmlctl.runtime.metrics import MetricLogger


def test_the_entry_point_and_the_metrics_share_one_writer(tmp_path: Path) -> None:
    rank_dir = str(tmp_path / "ranks")
    entry = protocol.rank_event_writer(rank_dir, 3)
    entry.start(local_rank=1, role="worker", host="h")
    metrics = MetricLogger(3, rank_dir)
    metrics.log(0, {"loss": 1.5})
    assert metrics._records() is entry
    metrics.close()  # ctx.close: the entry point still writes its exit record after it
    entry.exit(0, None, None)
    entry.close()
    lines = Path(protocol.rank_events(rank_dir, 3)).read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["start", "metric", "exit"]
    assert protocol.rank_event_writer(rank_dir, 4) is not entry  # one per rank


def test_records_given_after_the_entry_closed_its_writer_are_kept(tmp_path: Path) -> None:
    """An atexit handler that logs after a failed rank's exit record (the entry closes
    its writer there) still gets its records written, after the exit record."""
    rank_dir = str(tmp_path / "ranks")
    entry = protocol.rank_event_writer(rank_dir, 5)
    metrics = MetricLogger(5, rank_dir)
    metrics.log(0, {"loss": 1.0})
    entry.exit(1, {"exc_type": "ValueError", "message": "x", "traceback": []}, None)
    entry.close()
    metrics.log(1, {"loss": 0.5})
    assert protocol.rank_event_writer(rank_dir, 5) is not entry
    lines = Path(protocol.rank_events(rank_dir, 5)).read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["metric", "exit", "metric"]
