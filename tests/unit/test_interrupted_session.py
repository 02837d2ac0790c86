"""A test session interrupted with Ctrl-C leaves nothing behind: what its tests started
(an sshd of the SSH lab, an agent server) ends with it (tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.procs import alive, wait_until

REPO = Path(__file__).resolve().parents[2]

STARTS_AND_WAITS = """
import subprocess, sys, time

def test_starts_a_server_and_is_interrupted(tmp_path):
    # As the SSH lab starts sshd: in a session of its own, its config under tmp_path.
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", str(tmp_path / "sshd_config")],
        start_new_session=True,
    )
    (tmp_path.parent / "server.pid").write_text(str(server.pid))  # the basetemp
    time.sleep(600)
"""


def test_a_session_interrupted_by_ctrl_c_leaves_no_server_behind(tmp_path: Path) -> None:
    (tmp_path / "test_waits.py").write_text(STARTS_AND_WAITS)
    base = tmp_path / "base"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    argv += ["--basetemp", str(base), "--rootdir", str(tmp_path), str(tmp_path / "test_waits.py")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    session = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE)
    marker = base / "server.pid"
    wait_until(lambda: marker.exists() or session.poll() is not None, 60)
    if not marker.exists():
        session.kill()
        raise AssertionError(session.communicate()[0].decode())
    pid = int(marker.read_text())
    session.send_signal(signal.SIGINT)  # what Ctrl-C sends it
    session.communicate(timeout=60)
    assert wait_until(lambda: not alive(pid), 10), (
        f"the test's server (pid {pid}) outlived the interrupted session"
    )
