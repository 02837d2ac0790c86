"""A bench whose runs are commands of their own (``bench launch`` times ``dmlctl
launch`` and bare torchrun) stopped by ``timeout`` (SIGTERM to the bench alone): the
command under way is stopped as Ctrl-C stops it, the bench ends with exit 130, and no
process of it is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.integration.procs import wait_until

pytestmark = pytest.mark.integration


def processes_with(needle: str) -> list[int]:
    """Live processes whose environment holds ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle.encode() in environ and state != "Z":
            found.append(int(entry))
    return found


def test_sigterm_stops_the_command_under_way_and_ends_the_bench(cli: Cli) -> None:
    # Processes forked by an agent server show its environment, not the bench's.
    cli.extra_env["DMLCTL_AGENT_SERVER_IDLE"] = "0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dmlctl", "bench", "launch", "--json"],
        env=cli.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        said = [proc.stderr.readline() for _ in range(2)]
        assert said[0].startswith("dmlctl bench launch: 12 runs (5 + a warm-up, × 2 launchers)")
        assert said[1].strip() == "dmlctl warm-up", said
        own = "dmlctl-bench-launch-"  # the bench's own home for its runs: in their environment
        assert wait_until(lambda: len(processes_with(own)) >= 3, 30), said  # its run is up
        proc.send_signal(signal.SIGTERM)  # what `timeout` sends, to the bench alone
        out, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(said) + rest
    assert proc.returncode == 130, err
    assert "benchmark interrupted: `dmlctl launch` was stopped" in err, err
    assert "torchrun warm-up" not in err and out == "", err  # it did not go on
    deadline = time.monotonic() + 5
    while processes_with(own) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(own) == []  # nothing of the bench's run is left
