"""Parameter-server strategies end to end: the real CLI, torchrun, gloo ranks with
worker and server roles, on ``examples/parameter-server`` (its ``train.py`` runs
unchanged under every strategy).

Convergence target: the single-process run of the same script (same epochs, same
per-worker batch) reaches test loss ≈ 0.11 / accuracy ≈ 0.96. Every strategy, with
1–2 servers and 2–3 workers, must end within **0.04 test loss** and **0.02
accuracy** of that baseline (measured: 0.104–0.123 loss, 0.957–0.964 accuracy), except
adadelay, whose final iterate varies most with the arrival order (:data:`NOISY`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Cli
from tests.integration.procs import run_processes, wait_until

EXAMPLE = REPO / "examples" / "parameter-server"
pytestmark = pytest.mark.integration

LOSS_TOLERANCE = 0.04
ACC_TOLERANCE = 0.02
NOISY = {"adadelay-2w-1s": (0.07, 0.03)}
"""Wider (loss, accuracy) tolerances: adadelay's servers take a plain SGD step (no
momentum; 1/L ≈ 0.16 here, barely shrinking with c = 0.1), so where its final iterate
lands varies with the arrival order: 0.118–0.174 test loss over 39 runs of this test
(7 of the 23 with c = 0.1 above 0.15; c of 1 or 3 kept the tail)."""


@pytest.fixture(scope="module")
def baseline() -> dict[str, float]:
    """The single-process run: ``python train.py``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLCTL_")}
    out = subprocess.run(
        [sys.executable, "train.py"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("final test loss"))
    parts = line.split()
    return {"test_loss": float(parts[3]), "test_acc": float(parts[5])}


def _metrics(cli: Cli, run_id: str) -> list[dict[str, Any]]:
    path = cli.home / "runs" / run_id / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _final(cli: Cli, run_id: str) -> dict[str, float]:
    for record in reversed(_metrics(cli, run_id)):
        if "test_loss" in record["values"]:
            return dict(record["values"])
    raise AssertionError(f"run {run_id} logged no test_loss")


def _job(tmp_path: Path, name: str, body: str) -> Path:
    job = tmp_path / f"{name}.yaml"
    job.write_text(f"name: {name}\nworkdir: {EXAMPLE}\nscript: train.py\n{body}")
    return job


def _cluster(tmp_path: Path, slots: int) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"hosts:\n  - name: local\n    address: localhost\n    slots: {slots}\n")
    return path


CASES = {
    "asgd-2w-1s": ("asgd.yaml", None),
    "asgd-overlap-2w-1s": ("asgd-overlap.yaml", None),
    "ssp-2w-1s": ("ssp.yaml", None),
    "adadelay-2w-1s": ("adadelay.yaml", None),
    "easgd-async-2w-2s": ("easgd-async.yaml", None),
    "sync-ps-3w-1s": ("sync-ps.yaml", None),
    "aadmm-2w-1s": ("aadmm.yaml", None),
    "asgd-3w-2s": (
        None,
        "workers: 3\nparameter_servers: 2\nstrategy:\n  name: asgd\n  params: {n_fetch: 2}\n",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_strategy_reaches_the_single_process_loss(
    cli: Cli, tmp_path: Path, baseline: dict[str, float], case: str
) -> None:
    example, body = CASES[case]
    if example is not None:
        args = ["launch", str(EXAMPLE / example)]
    else:
        assert body is not None
        args = ["launch", str(_job(tmp_path, case, body)), "--cluster", str(_cluster(tmp_path, 3))]
    proc = cli.run(*args, "--ui", "plain", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = cli.runs()[0].name
    final = _final(cli, run_id)
    loss_tolerance, acc_tolerance = NOISY.get(case, (LOSS_TOLERANCE, ACC_TOLERANCE))
    assert final["test_loss"] <= baseline["test_loss"] + loss_tolerance, (final, baseline)
    assert final["test_acc"] >= baseline["test_acc"] - acc_tolerance, (final, baseline)
    state = cli.state(run_id)
    roles = [r["role"] for r in state["ranks"]]
    servers = 2 if "2s" in case else 1
    assert roles.count("server") == servers, roles
    # Every server reported its traffic and the staleness of what it applied.
    server_records = [m["values"] for m in _metrics(cli, run_id) if "push_per_s" in m["values"]]
    assert server_records, "no server metrics"
    assert all(
        v["staleness_max"] >= v["staleness_median"] >= 0
        for v in server_records
        if "staleness_max" in v
    )
    workers = [m["values"] for m in _metrics(cli, run_id) if "clock" in m["values"]]
    assert max(v["clock"] for v in workers) > 0


def _server_pid(cli: Cli, run_id: str, rank: int) -> int | None:
    path = cli.home / "runs" / run_id / "hosts" / "local" / f"rank-{rank}.events.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        record = json.loads(line)
        if record.get("kind") == "metric":  # serving (the start record came first)
            starts = [json.loads(x) for x in lines if '"start"' in x]
            return int(starts[-1]["pid"]) if starts else None
    return None


def _kill_server_mid_run(cli: Cli, job: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    proc = cli.popen("launch", str(job), "--ui", "plain")
    try:
        assert wait_until(lambda: bool(cli.runs()), 60)
        run_id = cli.runs()[0].name
        serving = wait_until(lambda: _server_pid(cli, run_id, 2) is not None, 90)
        assert serving, "the server never served"
        pid = _server_pid(cli, run_id, 2)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)  # never a hang
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, ""), run_id


def test_a_killed_server_fails_the_run_with_it_as_root_cause(cli: Cli, tmp_path: Path) -> None:
    job = _job(
        tmp_path,
        "serverkill",
        "args: ['--epochs', '40']\nworkers: 2\nparameter_servers: 1\nstrategy: asgd\n"
        "restart:\n  max_user_restarts: 0\n  max_infra_restarts: 0\n",
    )
    done, run_id = _kill_server_mid_run(cli, job)
    assert done.returncode == 1, done.stdout
    assert "rank 2" in done.stdout and "SIGKILL" in done.stdout, done.stdout
    state = cli.state(run_id)
    assert state["root_cause"]["rank"] == 2, state["root_cause"]
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


def test_a_killed_server_is_restarted_from_the_checkpoint(cli: Cli, tmp_path: Path) -> None:
    job = _job(
        tmp_path,
        "serverrestart",
        "args: ['--epochs', '6']\nworkers: 2\nparameter_servers: 1\nstrategy: ssp\n"
        "restart:\n  max_infra_restarts: 1\n  max_user_restarts: 1\n  backoff_initial: 0.2\n"
        "checkpoint:\n  every_steps: 200\n",
    )
    latest = None

    def checkpointed() -> bool:
        nonlocal latest
        runs = cli.runs()
        if not runs:
            return False
        latest = cli.home / "runs" / runs[0].name / "hosts" / "checkpoints" / "LATEST"
        return latest.is_file()

    proc = cli.popen("launch", str(job), "--ui", "plain")
    try:
        assert wait_until(checkpointed, 90), "no checkpoint was written"
        run_id = cli.runs()[0].name
        assert wait_until(lambda: _server_pid(cli, run_id, 2) is not None, 30)
        pid = _server_pid(cli, run_id, 2)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "resumes at step" in out, out
    state = cli.state(run_id)
    assert state["restarts"] == 1
    final = _final(cli, run_id)
    assert final["test_acc"] >= 0.9, final
    # A server process logs its own pushes as ``step`` and its shard's ``version``: equal
    # for the first server; the restarted one's version continues from the checkpoint,
    # so it leads by at least 2 workers × 200 steps − s.
    served = [m for m in _metrics(cli, run_id) if m["rank"] == 2 and "version" in m["values"]]
    leads = [m["values"]["version"] - m["step"] for m in served]
    assert leads and all(lead == 0 or lead >= 2 * 200 - 3 for lead in leads), leads
    assert leads[-1] >= 2 * 200 - 3, leads  # the last records are the restored server's
