"""``dmlctl bench straggler`` end to end: real ssgd and asgd runs of 3 workers on gloo."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import Cli

# serial: its throughput ratios hold on an idle machine (Makefile: after the rest).
pytestmark = [pytest.mark.integration, pytest.mark.serial]


def test_bench_straggler_slows_ssgd_more_than_asgd(cli: Cli) -> None:
    proc = cli.run(
        "bench",
        "straggler",
        "--scenarios",
        "ssgd,asgd",
        "--steps",
        "20",
        "--step-sleep",
        "0.02",
        "--json",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.startswith(
        "dmlctl bench straggler: 4 runs (2 scenarios × 1 × baseline and straggler) of about "
    )
    data = json.loads(proc.stdout)
    assert (data["steps"], data["factor"], len(data["run_ids"])) == (20, 3.0, 4)
    by_name = {s["name"]: s for s in data["scenarios"]}
    assert list(by_name) == ["ssgd", "asgd"]
    for s in by_name.values():
        rates = [*s["baseline_steps_per_s"].values(), *s["straggler_steps_per_s"].values()]
        assert len(rates) == 6 and all(math.isfinite(r) and r > 0 for r in rates), s
        assert s["straggler"] == 2 and set(s["fast_ratios"]) == {"0", "1"}
        assert 0 < s["straggler_pace"] < 0.6, s  # the straggler itself is ~3× slower
    assert by_name["asgd"]["ratio"] > by_name["ssgd"]["ratio"]
    assert by_name["ssgd"]["ratio"] < 0.6  # ssgd waits for the straggler every step
    last = cli.state(data["run_ids"][-1])  # asgd with the straggler: 3 workers + 1 server
    assert (last["phase"], last["world_size"], last["strategy"]) == ("succeeded", 4, "asgd")
