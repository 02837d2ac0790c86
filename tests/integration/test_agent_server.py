"""The agent server (``dmlctl.agent.server``): a first local launch starts it, the next
launch's host agent is forked by it — the launch's command line, a session of its
own, its exit code back to the controller — and it exits once idle; ``0`` turns it off.

Each test has a runtime directory of its own (``XDG_RUNTIME_DIR``, short: a socket's
path has at most 107 bytes), so its servers are its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Cli
from tests.integration.procs import agent_pid, cmdline, wait_until

pytestmark = pytest.mark.integration

JOBS = REPO / "tests" / "integration" / "jobs"
SLEEPY = REPO / "tests" / "ssh" / "jobs" / "sleepy"


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A runtime directory of this test's own, short enough for sockets."""
    path = Path(tempfile.mkdtemp(prefix="dmlctl-test-"))
    yield path
    for entry in os.listdir("/proc"):  # this test's servers, if any is left
        if entry.isdigit() and str(path) in cmdline(int(entry)):
            with contextlib.suppress(OSError):
                if _stat(int(entry))[0] == "dmlctl-server":
                    os.kill(int(entry), signal.SIGTERM)
    shutil.rmtree(path, ignore_errors=True)


def _stat(pid: int) -> tuple[str, int, int]:
    """(short name, parent pid, session id) of ``pid``."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw.rsplit(")", 1)[1].split()
    return name, int(fields[1]), int(fields[3])


def _answers(sock: Path) -> bool:
    """Whether a server listens on ``sock``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


def _sockets(runtime: Path) -> list[Path]:
    return sorted((runtime / "dmlctl").glob("agent-*.sock"))


def _second_launch(tmp_path: Path, runtime: Path, idle: float) -> tuple[Cli, subprocess.Popen[str]]:
    """A launch that starts a server (``idle`` seconds), then one of 2 s that gets its
    agent from it (running, ``--ui plain``)."""
    env = {"XDG_RUNTIME_DIR": str(runtime), "DMLCTL_AGENT_SERVER_IDLE": f"{idle:g}"}
    cli = Cli(tmp_path / "home", env)
    first = cli.run("launch", str(JOBS / "plain" / "job.yaml"), "--ui", "quiet")
    assert first.returncode == 0, first.stdout + first.stderr
    assert wait_until(lambda: len(_sockets(runtime)) == 1, 60), "no server"
    job = tmp_path / "job.yaml"
    job.write_text(f"script: train.py\nworkdir: {SLEEPY}\nworkers: 2\nargs: ['2']\n")
    return cli, cli.popen("launch", str(job), "--ui", "plain")


def test_the_next_launch_gets_an_agent_forked_by_the_server_which_ends_when_idle(
    tmp_path: Path, runtime: Path
) -> None:
    cli, proc = _second_launch(tmp_path, runtime, idle=10)
    agent, seen = agent_pid(proc)
    name, parent, session = _stat(agent)
    assert name == "dmlctl-agent" and session == agent
    assert _stat(parent)[0] == "dmlctl-server"
    run_id = cli.runs()[-1].name
    assert f"-m dmlctl.agent --run-id {run_id}" in cmdline(agent), cmdline(agent)
    out = "".join(seen) + proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    failed = cli.run("launch", str(JOBS / "fail" / "job.yaml"), "--ui", "plain")
    assert failed.returncode == 1, failed.stdout + failed.stderr  # the code comes back
    assert "ValueError" in failed.stdout + failed.stderr
    assert wait_until(lambda: _sockets(runtime) == [], 40), "the server stayed"


def test_zero_idle_time_starts_no_server(tmp_path: Path, runtime: Path) -> None:
    cli = Cli(tmp_path / "home", {"XDG_RUNTIME_DIR": str(runtime), "DMLCTL_AGENT_SERVER_IDLE": "0"})
    proc = cli.run("launch", str(JOBS / "plain" / "job.yaml"), "--ui", "quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (runtime / "dmlctl").exists()


def test_a_killed_server_leaves_its_agents_running_and_is_started_again(
    tmp_path: Path, runtime: Path
) -> None:
    """SIGKILL of the server while its agent runs: the run ends as it would have (its
    exit code is then read from the agent's end), and the next launch starts a new
    server in place of the dead one's socket."""
    cli, proc = _second_launch(tmp_path, runtime, idle=10)
    server = _stat(agent_pid(proc)[0])[1]
    assert _stat(server)[0] == "dmlctl-server"
    os.kill(server, signal.SIGKILL)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    (sock,) = _sockets(runtime)
    again = cli.run("launch", str(JOBS / "plain" / "job.yaml"), "--ui", "quiet")
    assert again.returncode == 0, again.stdout + again.stderr
    assert wait_until(lambda: _answers(sock), 30), "no new server"
