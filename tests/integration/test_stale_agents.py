"""``launch --resume`` first stops the agents a dead controller left running (real
processes through the local transport; a pid file never leads to a stranger)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dmlctl.agent_config import TorchrunCommand
from dmlctl.plan.model import HostPlan
from dmlctl.provision.agents import stop_stale_agents
from dmlctl.transport.local import LocalTransport

pytestmark = pytest.mark.integration
RUN_ID = "job-20261121-000000-abcd"


def host(rank_dir: Path) -> HostPlan:
    return HostPlan(
        name="local",
        address="localhost",
        is_local=True,
        port=22,
        user=None,
        identity_file=None,
        node_rank=0,
        nproc=1,
        first_rank=0,
        python=sys.executable,
        workdir=str(rank_dir),
        rank_dir=str(rank_dir),
        agent_argv=(),
        agent_cwd=None,
        torchrun=TorchrunCommand(sys.executable, 1, 1, "localhost:1", RUN_ID, "t.py"),
        env={},
    )


def sleeper(*label: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *label])


def test_agents_left_running_are_stopped_and_strangers_spared(tmp_path: Path) -> None:
    rank_dir = tmp_path / "hosts" / "local"
    (rank_dir / "attempt-1").mkdir(parents=True)
    (rank_dir / "attempt-2").mkdir()
    old = sleeper("--run-id", RUN_ID)  # the first attempt's agent
    later = sleeper("--run-id", RUN_ID)  # a restarted attempt's agent
    stranger = sleeper("--run-id", "another-run")  # a reused pid: not ours
    (rank_dir / "agent.pid").write_text(f"{old.pid}\n")
    (rank_dir / "attempt-1" / "agent.pid").write_text(f"{later.pid}\n")
    (rank_dir / "attempt-2" / "agent.pid").write_text(f"{stranger.pid}\n")  # pid reused
    try:
        problems = stop_stale_agents(RUN_ID, [host(rank_dir)], {"local": LocalTransport()})
        assert old.wait(10) == -15 and later.wait(10) == -15  # SIGTERM: they stop their ranks
        assert stranger.poll() is None
        assert len(problems) == 1 and "stopped agents left running" in problems[0]
        assert stop_stale_agents(RUN_ID, [host(rank_dir)], {"local": LocalTransport()}) == []
    finally:
        for p in (old, later, stranger):
            p.kill()
            p.wait()
