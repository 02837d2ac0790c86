"""Losing a host mid-run, on real sshd hosts: the run goes on with the hosts left
(``min_hosts``), from the checkpoint the controller kept, or fails clearly."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.procs import run_processes, wait_until
from tests.ssh.lab import SshLab, start_lab
from tests.ssh.test_remote import LabCli, cluster_file

ELASTIC = Path(__file__).parent / "jobs" / "elastic"
pytestmark = pytest.mark.ssh


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[SshLab]:
    """A lab of this test's own: its hosts get killed."""
    with start_lab(tmp_path / "lab", n_hosts=2) as lab:
        yield lab


def _job(tmp_path: Path, extra: str, restart: str = "") -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: elastic\nscript: train.py\nworkdir: {ELASTIC}\nworkers: 2\n"
        f"env:\n  OUT: {tmp_path / 'out.txt'}\n"
        "checkpoint:\n  every_steps: 5\n"
        "restart:\n  max_infra_restarts: 2\n  backoff_initial: 0.2\n"
        "  host_wait: 3\n  host_cooldown: 60\n  stop_grace: 1\n" + restart + extra
    )
    return job


def _run_until_copied(
    cli: LabCli,
    lab: SshLab,
    tmp_path: Path,
    extra: str,
    *,
    freeze: bool = False,
    timeout: str = "",
) -> tuple[str, float]:
    """Launch on both hosts (one worker each), wait until the controller holds a
    checkpoint copy, then kill node-a (the rendezvous host) — or freeze it, a host cut
    off — and wait until the controller has noticed (a restart): returns (run, seconds
    from the fault to that)."""
    cluster = cluster_file(lab, tmp_path, **{h.alias: "slots: 1" for h in lab.hosts})
    proc = cli.popen(
        "launch", str(_job(tmp_path, extra, timeout)), "--cluster", str(cluster), "--ui", "plain"
    )
    if not wait_until(lambda: len(cli.runs()) == 1 or proc.poll() is not None, 60):
        proc.kill()
    assert len(cli.runs()) == 1, proc.communicate()[0]
    run_id = cli.runs()[0].name
    latest = cli.home / "runs" / run_id / "checkpoints" / "LATEST"
    assert wait_until(latest.is_file, 90), "the controller never got a checkpoint copy"
    killed = time.monotonic()
    if freeze:
        lab.freeze_host("node-a")
    else:
        lab.kill_host("node-a")
    noticed = wait_until(lambda: cli.state(run_id)["restarts"] >= 1, 30)
    took = time.monotonic() - killed
    cli.proc = proc  # type: ignore[attr-defined]
    assert noticed, "the lost host was never noticed"
    return run_id, took


def test_a_lost_host_is_replaced_by_the_hosts_left(lab: SshLab, tmp_path: Path) -> None:
    cli = LabCli(tmp_path / "home", lab)
    run_id, took = _run_until_copied(cli, lab, tmp_path, "min_hosts: 1\n")
    assert took < 15, took  # the connection closes: noticed at once, restarted after
    out, _ = cli.proc.communicate(timeout=120)  # type: ignore[attr-defined]
    assert cli.proc.returncode == 0, out  # type: ignore[attr-defined]
    state = cli.state(run_id)
    lost = state["failures"][0]
    assert (lost["host"], lost["exc_type"]) == ("node-a", "AgentLost"), lost
    assert state["hosts"] == ["node-b"] and state["world_size"] == 1
    # node-b had only rank 1's files; rank 0 of the smaller world needs rank-0.pt,
    # which only the controller's copy could hand it.
    starts = [line for line in out.splitlines() if "attempt 2 starts at step" in line]
    assert starts and "rank 0 of 1" in starts[0], out
    assert int(starts[0].rsplit(" ", 1)[1]) >= 5, starts
    assert "was saved by 2 ranks; rank 0 of 1 resumes from rank-0.pt" in out, out
    assert (tmp_path / "out.txt").read_text().startswith("40 ")
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


def test_too_few_hosts_left_fails_clearly_without_hanging(lab: SshLab, tmp_path: Path) -> None:
    cli = LabCli(tmp_path / "home", lab)
    started = time.monotonic()
    run_id, _ = _run_until_copied(cli, lab, tmp_path, "")
    out, _ = cli.proc.communicate(timeout=120)  # type: ignore[attr-defined]
    took = time.monotonic() - started
    assert cli.proc.returncode == 1, out  # type: ignore[attr-defined]
    cause = cli.state(run_id)["root_cause"]
    assert cause["exc_type"] == "HostsLost", cause
    assert "node-a" in cause["message"] and "min_hosts" in cause["message"], cause
    assert took < 120, took  # host_wait 3 s: never a collective timeout
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)
    summary = json.loads((cli.home / "runs" / run_id / "summary.json").read_text())
    assert summary


# serial: a silence of host_timeout (3 s) is told from a loaded host on an idle machine.
@pytest.mark.serial
def test_a_host_cut_off_is_noticed_by_its_silence(lab: SshLab, tmp_path: Path) -> None:
    """node-a stops answering but its connection stays open (SIGSTOP of everything
    there): noticed within host_timeout (3 s here) plus the attempt's teardown, and the
    run goes on with node-b alone."""
    cli = LabCli(tmp_path / "home", lab)
    try:
        run_id, took = _run_until_copied(
            cli, lab, tmp_path, "min_hosts: 1\n", freeze=True, timeout="  host_timeout: 3\n"
        )
        assert took < 15, took
        out, _ = cli.proc.communicate(timeout=120)  # type: ignore[attr-defined]
        assert cli.proc.returncode == 0, out  # type: ignore[attr-defined]
        state = cli.state(run_id)
        lost = state["failures"][0]
        assert (lost["host"], lost["exc_type"]) == ("node-a", "AgentLost"), lost
        assert "no message from the host for 3 s" in lost["message"], lost
        assert state["hosts"] == ["node-b"]
        # The end does not wait on the lost host's timeout to collect its files.
        assert "rank files of node-a not collected: the host was lost" in out, out
        assert "could not collect rank files" not in out, out
        assert (tmp_path / "out.txt").read_text().startswith("40 ")
    finally:
        lab.kill_host("node-a")
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)
