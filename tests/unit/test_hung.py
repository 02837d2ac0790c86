"""tests.hung.describe: what a run that outlived its test's timeout was doing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests import hung

RANK = """
import faulthandler, signal, sys, time
f = open(sys.argv[1], "ab", buffering=0)
f.write(b"dmlctl: rank 0 pid %d main thread 0x1\\n" % __import__("os").getpid())
faulthandler.register(signal.SIGUSR2, file=f, all_threads=True)
def wait_for_peer():
    print("ready", flush=True)
    time.sleep(60)
wait_for_peer()
"""


def asleep(pid: int, within: float = 10.0) -> None:
    """Return once process ``pid`` sleeps (state S), or fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "S":
        assert time.monotonic() < deadline, f"process {pid} never slept"
        time.sleep(0.01)


def test_describe_lists_the_runs_processes_and_dumps_each_ranks_stack(tmp_path: Path) -> None:
    home = tmp_path / "home"
    rank_dir = home / "runs" / "r1" / "hosts" / "local"
    rank_dir.mkdir(parents=True)
    (rank_dir / "rank-0.stdout").write_text("rank 0/2: 8000 training samples\n")
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, str(rank_dir / "rank-0.stacks")],
        env={**os.environ, "DMLCTL_HOME": str(home)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        asleep(rank.pid)  # past its print, in time.sleep (a loaded machine lags)
        text = hung.describe(home)
    finally:
        rank.kill()
        rank.wait()
    procs, _, files = text.partition("--- ")
    assert f"\n  {rank.pid} {os.getpid()} S " in procs, text
    assert "rank 0/2: 8000 training samples" in files, text
    assert "in wait_for_peer" in files, text  # the stack the signal dumped


def test_describe_of_a_home_without_runs_says_so(tmp_path: Path) -> None:
    text = hung.describe(tmp_path / "missing")
    assert text.splitlines()[1:] == ["  none"], text
