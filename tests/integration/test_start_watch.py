"""A rank that never starts (stuck before its first heartbeat: here in its
interpreter's start, before any of dmlctl's code runs in it) is a hang once the job's
``restart.start_timeout`` passed: named, with the stacks read from outside, and the
run ends with it as the root cause instead of waiting forever."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import Cli

pytestmark = [pytest.mark.integration, pytest.mark.compat]
JOB = Path(__file__).parent / "jobs" / "nostart"
START_TIMEOUT = 25  # rank 0 beats long before: it waits in the barrier for rank 1


def test_a_rank_stuck_before_its_first_heartbeat_is_named_as_hung(cli: Cli, tmp_path: Path) -> None:
    job = tmp_path / "nostart"
    shutil.copytree(JOB, job, ignore=shutil.ignore_patterns("__pycache__"))
    (job / "job.yaml").write_text(
        "script: train.py\nworkers: 2\nstrategy: none\n"
        f"env: {{PYTHONPATH: {str(job)!r}}}\n"
        f"restart: {{start_timeout: {START_TIMEOUT}, max_infra_restarts: 0, stop_grace: 1}}\n"
    )
    # fresh: a warm rank is forked past its interpreter's start (no sitecustomize)
    proc = cli.run(
        "launch", str(job / "job.yaml"), "--ui", "plain", "--ranks", "fresh", timeout=180
    )
    assert proc.returncode != 0, proc.stdout
    cause = cli.state(cli.runs()[-1].name)["root_cause"]
    assert (cause["exc_type"], cause["rank"]) == ("Hang", 1), cause
    assert "never started" in cause["message"] and "start_timeout" in cause["message"], cause
    stacks = "\n".join(cause.get("traceback") or [])
    if shutil.which("gdb") or shutil.which("py-spy"):
        assert "sleep" in stacks, stacks  # where it is stuck, read from outside
