"""``dmlctl bench advise`` end to end: the real CLI runs the job of
``jobs/advise`` (2 workers, an MLP on blobs, rank 0 logs ``test_acc``) once per
candidate, each as an ordinary run; the report ranks them, a candidate the script
refuses (bmuf) is reported failed while the others still run, and the budget stops a
run that would go on for minutes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.integration

JOB = Path(__file__).parent / "jobs" / "advise"


def test_advise_ranks_candidates_reports_a_failed_one_and_writes_json_and_png(
    cli: Cli, tmp_path: Path
) -> None:
    png, saved = tmp_path / "advice.png", tmp_path / "advice.yaml"
    proc = cli.run(
        "bench",
        "advise",
        str(JOB / "long.yaml"),  # 500 epochs: each run goes on until it is stopped
        "--target",
        "test_acc>=0.9",
        "--strategies",
        "ssgd,bmuf,local-sgd:period=8",
        "--budget",
        "90s",
        "--json",
        "--plot",
        str(png),
        "--save",
        str(saved),
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = "3 runs (3 candidates × 1 scenario) of at most 90s each: up to 0:04:30"
    assert proc.stderr.startswith(f"dmlctl bench advise: {plan}"), proc.stderr  # said first
    report = json.loads(proc.stdout)
    (scenario,) = report["scenarios"]
    assert scenario["name"] == "this machine"
    rows = scenario["candidates"]
    assert [r["label"] for r in rows][-1] == "bmuf"
    assert {r["label"] for r in rows[:2]} == {"ssgd", "local-sgd period=8"}
    assert all(r["status"] == "reached" for r in rows[:2]), rows
    first, second = rows[0]["time_to_target_s"], rows[1]["time_to_target_s"]
    assert 0 < first <= second
    by_label = {r["label"]: r for r in rows}
    # period 8 sends an eighth of ssgd's bytes per step, so far less by the target
    local, ssgd = by_label["local-sgd period=8"], by_label["ssgd"]
    assert local["bytes_to_target"] < ssgd["bytes_to_target"] / 4
    # each run was stopped once it got there (the job would go on for 500 epochs)
    assert all(cli.state(r["run_id"])["phase"] == "stopped" for r in (local, ssgd))
    assert rows[-1]["status"] == "failed" and "SystemExit" in rows[-1]["detail"]
    assert scenario["recommendation"]["label"] == rows[0]["label"]
    assert scenario["recommendation"]["snippet"].startswith("strategy:\n  name: ")
    # Every candidate is an ordinary run, visible in status under the job's name.
    listed = cli.run("status", "--all").stdout
    for row in rows:
        assert row["run_id"] in listed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    # A job that says `strategy: auto` runs what the advisor recommended, and says so.
    (tmp_path / "train.py").write_text((JOB / "train.py").read_text())
    job = tmp_path / "job.yaml"
    job.write_text("script: train.py\nworkers: 2\nstrategy: {name: auto, advice: advice.yaml}\n")
    dry = cli.run("launch", str(job), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    best = rows[0]["candidate"]["strategy"]
    assert f"dmlctl: strategy {rows[0]['label']} from advice.yaml: reached" in dry.stdout
    assert f"strategy {best}, 2 workers" in dry.stdout


def test_the_budget_stops_long_runs_in_each_scenario_and_the_tables_say_so(cli: Cli) -> None:
    """Two scenarios (this machine, and with a 3× straggler), one candidate each."""
    started = time.monotonic()
    proc = cli.run(
        "bench",
        "advise",
        str(JOB / "long.yaml"),
        "--target",
        "test_acc>=2",  # never met: the run would train 500 epochs
        "--strategies",
        "ssgd",
        "--budget",
        "8s",
        "--straggler",
        "3x",
        timeout=300,
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.strip().startswith("1 ")]
    assert len(rows) == 2 and all("budget" in row and "ssgd" in row for row in rows)
    assert proc.stdout.count("no candidate reached test_acc>=2 within the budget") == 2
    assert "place and seconds to test_acc>=2 by scenario" in proc.stdout
    assert took < 2 * (8 + 45), took  # the budget, then the stop's teardown, twice
    runs = sorted(cli.runs(), key=lambda r: r.stat().st_mtime)
    for run in runs:
        assert f"1. ssgd: run {run.name}" in proc.stdout
        assert cli.state(run.name)["phase"] == "stopped"
    plan = json.loads((runs[1] / "plan.json").read_text())
    assert "DMLCTL_STRAGGLER" in plan["hosts"][0]["env"]  # the value is redacted there
