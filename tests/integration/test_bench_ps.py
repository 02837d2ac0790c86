"""``dmlctl bench ps`` end to end: a real run of 2 workers + 1 server on gloo."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.integration


def test_bench_ps_reports_finite_throughputs_and_a_ratio_per_size(cli: Cli) -> None:
    proc = cli.run(
        "bench", "ps", "--max-bytes", "64K", "--iters", "5", "--warmup", "1", "--json", timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.startswith("dmlctl bench ps: 1 run of about 0:00:")  # before it starts
    data = json.loads(proc.stdout)
    assert (data["workers"], data["servers"], data["goal"]) == (2, 1, 0.5)
    assert [r["bytes"] for r in data["results"]] == [64 << 10]
    for r in data["results"]:
        rates = (r["ps_bytes_per_s"], r["allreduce_bytes_per_s"], r["ratio"])
        assert all(math.isfinite(v) and v > 0 for v in rates), r
        assert r["ratio"] == pytest.approx(r["ps_bytes_per_s"] / r["allreduce_bytes_per_s"])
    assert data["ratio_at_largest"] == data["results"][-1]["ratio"]
    state = cli.state(data["run_id"])
    assert state["world_size"] == 3
