"""Progress the runtime adds to metric records: ``epoch`` and ``progress`` (0 to 1)
from ``ctx.shard``'s epochs, or from ``ctx.total_steps`` for a loop of the script's
own; and the batch count it rests on, against torch's own sampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from dmlctl.protocol import ENV_RANK_DIR, rank_events
from dmlctl.runtime.data import batches_per_epoch

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import dmlctl, torch
ctx = dmlctl.init()
for x in ctx.shard(torch.arange(10.0).reshape(10, 1), batch_size=3, epochs=2):
    ctx.log(loss=float(x.sum()))
ctx.log(step=100, test_acc=0.5, epoch=7)  # after the data: the script's epoch wins
ctx.total_steps = 5
for i in range(5):
    ctx.log(step=i, loss=1.0)
"""


@pytest.mark.parametrize("length", [1, 7, 10, 11, 64])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_per_epoch_matches_the_sampler(
    length: int, world: int, batch: int, drop_last: bool
) -> None:
    data = torch.arange(length)
    for rank in range(world):
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, drop_last=drop_last)  # type: ignore[var-annotated, arg-type]
        n = len(list(sampler))
        expected = n // batch if drop_last else -(-n // batch)
        assert batches_per_epoch(length, world, batch, drop_last) == expected


def test_records_carry_epoch_and_progress(tmp_path: Path) -> None:
    env = {**os.environ, ENV_RANK_DIR: str(tmp_path), "PYTHONPATH": str(REPO)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = Path(rank_events(str(tmp_path), 0)).read_text().splitlines()
    values = [r["values"] for r in map(json.loads, lines) if r.get("kind") == "metric"]
    shard = values[:8]  # 10 samples, batch 3: 4 batches per epoch, 2 epochs
    assert [v["epoch"] for v in shard] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [v["progress"] for v in shard] == pytest.approx([k / 8 for k in range(1, 9)])
    assert values[8]["epoch"] == 7 and values[8]["progress"] == 1.0
    assert [v["progress"] for v in values[9:]] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_a_rank_that_has_not_stepped_says_what_it_does(tmp_path: Path) -> None:
    """The heartbeat's start-up stage, read from the live main thread: inside an import
    (a module that takes a while to import), while dmlctl.init() joins, once steps
    are due; nothing once the rank has stepped."""
    import importlib
    import threading

    from dmlctl.runtime import guards
    from dmlctl.runtime.heartbeat import Heartbeat, start_stage
    from dmlctl.runtime.progress import Tracker
    from dmlctl.runtime.where import FrameNamer

    tracker = Tracker()
    beats = Heartbeat(None, FrameNamer(str(tmp_path)), tracker)  # type: ignore[arg-type]
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(0.6)\n")
    seen: list[dict[str, object]] = []
    timer = threading.Timer(0.3, lambda: seen.append(beats.beat()))
    sys.path.insert(0, str(tmp_path))
    try:
        timer.start()
        importlib.import_module("slow_module")
    finally:
        sys.path.remove(str(tmp_path))
    assert seen and seen[0]["stage"] == "importing", seen
    assert "stage" not in beats.beat()  # its own code, not an import
    with guards.joining(0, servers=False):
        assert beats.beat()["stage"] == "joining"
    assert start_stage([], prepared=True) == "first step"  # after ctx.prepare
    tracker.step()
    assert "stage" not in beats.beat()  # it stepped
    server = Tracker()
    server.serving()  # a parameter server: shown serving, whatever it counts
    assert Heartbeat(None, FrameNamer(str(tmp_path)), server).beat()["stage"] == "serving"  # type: ignore[arg-type]
