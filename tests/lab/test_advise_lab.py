"""``dmlctl bench advise --lab 20mbit``: the candidates run once on this machine and
once on a lab network made for the scenario (its SSH hosts, shaped links), which is
removed after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.lab.conftest import lab_cli
from tests.lab.test_lab import _leftovers

pytestmark = pytest.mark.integration


def test_advise_runs_each_candidate_on_a_lab_it_makes_and_removes(tmp_path: Path) -> None:
    cli = lab_cli(tmp_path)
    job = REPO / "tests" / "integration" / "jobs" / "advise" / "job.yaml"
    proc = cli.run(
        "bench", "advise", str(job), "--target", "test_acc>=0.9", "--strategies", "ssgd",
        "--budget", "90s", "--lab", "20mbit", "--json", timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    here, lab = json.loads(proc.stdout)["scenarios"]
    assert (here["name"], lab["name"]) == ("this machine", "lab 20mbit")
    assert lab["lab_bandwidth"] == 20_000_000
    (row,) = lab["candidates"]
    assert row["status"] == "reached", row
    assert cli.state(row["run_id"])["hosts"] == ["lab-0", "lab-1"]  # over the lab's SSH
    assert _leftovers() == [] and not cli.lab_dir.exists()
