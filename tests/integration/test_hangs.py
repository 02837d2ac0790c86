"""The hang detector end to end (real agent, torchrun, gloo ranks) while another
process keeps a core busy: long healthy stretches are never called hangs, real hangs
are found within hang_timeout + 2 s, with the right rank and frame, after every
rank's stacks were dumped.

The workload is the benchmark's (``dmlctl/bench/hang_job/train.py``); here with
hang_timeout 4 s and stretches of 6 s (+5 s on rank 1, while rank 0 waits for it in a
collective): each healthy case would have been killed by a detector that calls any
rank without progress for hang_timeout seconds hung, and ``starved`` (a rank that holds
its interpreter's lock while it gets a hundredth of a core, as each of 64 ranks
starting on 2 cores does: silent, but runnable) by one that calls a silent rank with
little CPU frozen. The five healthy runs go side by side (they mostly wait); the hangs
one at a time, their delays bounded.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dmlctl.bench import hangs
from tests.conftest import Cli
from tests.integration.procs import run_processes

# serial: the delays are bounded against the burner alone (Makefile: after the rest).
pytestmark = [pytest.mark.integration, pytest.mark.serial]
JOB_DIR = hangs.JOB_DIR  # the hang bench's workload
TIMEOUT = 4.0


@pytest.fixture(scope="module")
def burner() -> Iterator[None]:
    """A second process burning a core for the whole module."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    proc.kill()
    proc.wait()


def _job(tmp_path: Path, scenario: str) -> Path:
    job = tmp_path / f"{scenario}.yaml"
    job.write_text(
        f"name: hang-{scenario}\nscript: train.py\nworkdir: {JOB_DIR}\nworkers: 2\n"
        f"args: [--scenario, {scenario}, --seconds, '6', --skew, '5', --steps, '40']\n"
        f"restart: {{hang_timeout: {TIMEOUT}, max_infra_restarts: 0, stop_grace: 1}}\n"
    )
    return job


def _launch(cli: Cli, tmp_path: Path, scenario: str) -> tuple[str, str, dict[str, object]]:
    proc = cli.run("launch", str(_job(tmp_path, scenario)), "--ui", "plain", timeout=240)
    run_id = cli.runs()[-1].name
    return run_id, proc.stdout + proc.stderr, cli.state(run_id)


HEALTHY = ("prep", "gil", "starved", "compile", "eval")


@pytest.fixture(scope="module")
def healthy_runs(
    tmp_path_factory: pytest.TempPathFactory, burner: None
) -> dict[str, tuple[str, str, dict[str, object]]]:
    """The healthy scenarios launched side by side (they mostly wait: 6 s stretches),
    each in its own home: scenario → (run id, output, final state). Four runs at once
    beside the burner load the cores more than one would: a detector that mistook a
    slow, healthy stretch for a hang would do so here first."""
    started: dict[str, tuple[Cli, subprocess.Popen[str]]] = {}
    for scenario in HEALTHY:
        tmp = tmp_path_factory.mktemp(f"healthy-{scenario}")
        cli = Cli(tmp / "home")
        started[scenario] = (cli, cli.popen("launch", str(_job(tmp, scenario)), "--ui", "plain"))
    out: dict[str, tuple[str, str, dict[str, object]]] = {}
    try:
        for scenario, (cli, proc) in started.items():
            stdout, _ = proc.communicate(timeout=240)  # stderr goes to stdout
            run_id = cli.runs()[-1].name
            out[scenario] = (run_id, stdout, cli.state(run_id))
    finally:
        for _, proc in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return out


@pytest.mark.parametrize("scenario", HEALTHY)
def test_long_healthy_stretches_are_not_hangs(
    healthy_runs: dict[str, tuple[str, str, dict[str, object]]], scenario: str
) -> None:
    run_id, out, state = healthy_runs[scenario]
    assert (state["phase"], state["restarts"]) == ("succeeded", 0), out
    assert "seems hung" not in out, out
    assert out.count("done, accuracy") == 2, out
    assert not run_processes(run_id)


def _hang_start(out: str) -> tuple[float, str]:
    m = re.search(r"\[rank 1\] HANG (\d+\.\d+) (\S+)", out)
    assert m is not None, out
    return float(m.group(1)), m.group(2)


def test_a_deadlocked_rank_is_named_with_its_frame(cli: Cli, tmp_path: Path, burner: None) -> None:
    run_id, out, state = _launch(cli, tmp_path, "deadlock")
    assert state["phase"] == "failed", out
    cause = state["root_cause"]
    started, frame = _hang_start(out)
    assert (cause["rank"], cause["host"], cause["exc_type"]) == (1, "local", "Hang"), cause
    assert f"at {frame} in wait_for_batch" in cause["message"], cause
    assert "never entered all_reduce #" in cause["message"], cause
    assert "which rank 0 has waited in" in cause["message"], cause
    delay = cause["ts"] - started
    assert TIMEOUT <= delay <= TIMEOUT + 2, (delay, out)
    # Every rank's stacks are in the run directory and shown by `dmlctl logs --stacks`.
    stacks = cli.run("logs", run_id, "--stacks")
    assert stacks.returncode == 0, stacks.stderr
    assert "=== rank 0 on local" in stacks.stdout and "=== rank 1 on local" in stacks.stdout
    assert "in wait_for_batch" in stacks.stdout and "dmlctl-heartbeat" not in cause["message"]
    assert any("wait_for_batch" in line for line in cause["traceback"]), cause
    assert not run_processes(run_id)


def test_a_stopped_rank_is_named_within_the_timeout(cli: Cli, tmp_path: Path, burner: None) -> None:
    run_id, out, state = _launch(cli, tmp_path, "sigstop")
    assert state["phase"] == "failed", out
    cause = state["root_cause"]
    started, _ = _hang_start(out)
    assert (cause["rank"], cause["exc_type"]) == (1, "Hang"), cause
    assert "its process is stopped" in cause["message"], cause
    assert cause["ts"] - started <= TIMEOUT + 2, (cause["ts"] - started, out)
    assert not run_processes(run_id)
