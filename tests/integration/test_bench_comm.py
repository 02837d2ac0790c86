"""comm_worker.py under bare torchrun (2 ranks, gloo): one record per (op, size)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dmlctl.bench.comm import BENCH_DIR, WORKER_SCRIPT
from dmlctl.bench.report import OPS, bus_factor, parse_metrics
from dmlctl.protocol import rank_events

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SIZES = [1024, 4096, 16384]


def run_worker(
    tmp_path: Path, *args: str, rank_dir: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("DMLCTL_RANK_DIR", None)
    if rank_dir:
        env["DMLCTL_RANK_DIR"] = str(tmp_path)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(BENCH_DIR / WORKER_SCRIPT),
        "--min-bytes",
        "1K",
        "--max-bytes",
        "16K",
        "--iters",
        "3",
        "--warmup",
        "1",
        *args,
    ]
    return subprocess.run(
        argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )


def test_worker_writes_one_record_per_op_and_size_from_rank_0(tmp_path: Path) -> None:
    proc = run_worker(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not Path(rank_events(str(tmp_path), 1)).exists()  # only rank 0 reports
    with open(rank_events(str(tmp_path), 0), encoding="utf-8") as f:
        results = parse_metrics(f)
    assert [(r.op, r.bytes) for r in results] == [(op, size) for op in OPS for size in SIZES]
    for r in results:
        assert r.time_us > 0 and r.algbw_gbps > 0
        assert r.algbw_gbps == pytest.approx(r.bytes / (r.time_us * 1e-6) / 1e9)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * bus_factor(r.op, 2))
        per_rank = r.bytes // 2 if r.op == "allgather" else r.bytes
        assert r.count * 4 == per_rank and r.dtype == "float32"


def test_worker_prints_json_lines_without_dmlctl(tmp_path: Path) -> None:
    proc = run_worker(tmp_path, "--ops", "broadcast", rank_dir=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = parse_metrics(proc.stdout.splitlines())
    assert [(r.op, r.bytes) for r in results] == [("broadcast", s) for s in SIZES]
