"""``dmlctl bench parallel`` end to end: real runs of 4 workers on gloo, plain data
parallelism and FSDP2, a few steps each; the bytes each rank holds are exact."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.integration

PARAMETERS = 3_302_912  # the example transformer's
TENSORS = 53  # its parameter tensors: AdamW keeps a 4-byte step for each


def test_bench_parallel_measures_data_parallel_and_fsdp(cli: Cli) -> None:
    proc = cli.run(
        "bench",
        "parallel",
        "--layouts",
        "dp4,fsdp4",
        "--steps",
        "5",
        "--repeats",
        "1",
        "--json",
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # what it will do, before it does it
    assert proc.stderr.startswith("dmlctl bench parallel: 2 runs (2 layouts × 1) of about ")
    data = json.loads(proc.stdout)
    model = data["model"]
    assert model["param_bytes"] == 4 * PARAMETERS
    assert model["optim_bytes"] == 2 * 4 * PARAMETERS + 4 * TENSORS
    dp, fsdp = data["layouts"]["dp4"], data["layouts"]["fsdp4"]
    assert (dp["replicas"], fsdp["replicas"]) == (4, 4)
    # DDP: every rank holds the whole model; FSDP2: a quarter of every tensor
    assert [r["bytes"] for r in dp["ranks"]] == [model["bytes"]] * 4 and dp["memory_ratio"] == 1
    assert [r["param_bytes"] for r in fsdp["ranks"]] == [PARAMETERS] * 4
    assert fsdp["goals"]["memory_ratio"]["value"] == fsdp["memory_ratio"] < 0.2501
    for row in (dp, fsdp):
        rate = row["samples_per_s"]["median"]
        assert math.isfinite(rate) and rate > 0
        assert rate == pytest.approx(4 * row["replica_samples_per_s"]["median"])
    assert dp["ratio"] == 1.0 and fsdp["ratio"] > 0
