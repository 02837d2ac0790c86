"""``dmlctl attach RUN`` on a detached run: it follows the run, Ctrl-C only detaches
(the run goes on), and once the run ended it prints the summary and exits with the
run's code."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"


def _phase(cli: Cli, run_id: str) -> str:
    return str(json.loads(cli.run("status", run_id, "--json").stdout)["phase"])


def _attach(cli: Cli, run_id: str) -> subprocess.Popen[str]:
    """``dmlctl attach RUN`` with Python's fault handler on (see :func:`_output`)."""
    return subprocess.Popen(
        [sys.executable, "-m", "dmlctl", "attach", run_id],
        env={**cli.env, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _output(watcher: subprocess.Popen[str]) -> str:
    """What ``watcher`` printed by its end; one still running after 30 s fails the test
    with its threads' stacks (SIGABRT makes the fault handler print them)."""
    try:
        return watcher.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        watcher.send_signal(signal.SIGABRT)
        stacks = watcher.communicate(timeout=30)[0]
        raise AssertionError(f"attach did not end 30 s after Ctrl-C:\n{stacks}") from None


def _polling(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` is seen asleep within ``timeout`` seconds: attach sleeps
    first between two reads of its run, with its Ctrl-C handler in place (before, it
    only imports and reads)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/wchan") as f:
            if "nanosleep" in f.read():
                return True
        time.sleep(0.02)
    return False


def test_attach_detaches_on_ctrl_c_and_reports_the_end(cli: Cli) -> None:
    started = cli.run("launch", str(JOBS / "forever" / "job.yaml"), "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    deadline = time.monotonic() + 60
    while _phase(cli, run_id) != "running" and time.monotonic() < deadline:
        time.sleep(0.5)
    try:
        watcher = _attach(cli, run_id[:14])
        # Attached (polling the run): Ctrl-C now detaches; before, it interrupts a start.
        assert _polling(watcher.pid, 60)
        watcher.send_signal(signal.SIGINT)
        out = _output(watcher)
        assert watcher.returncode == 0, out
        assert f"detached; run {run_id} goes on" in out and "rank" in out
        assert _phase(cli, run_id) == "running"  # Ctrl-C in attach never stops the run
    finally:
        assert cli.run("stop", run_id).returncode == 0
    deadline = time.monotonic() + 60
    while _phase(cli, run_id) not in ("stopped", "failed") and time.monotonic() < deadline:
        time.sleep(0.5)
    ended = cli.run("attach", "last")
    assert ended.returncode == 130, ended.stdout + ended.stderr  # the run's own code
    assert f"run {run_id} stopped" in ended.stdout
