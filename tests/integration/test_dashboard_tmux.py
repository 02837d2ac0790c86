"""The live dashboard in a real terminal: ``dmlctl launch --ui live`` inside an 80×24
tmux session; the screen it leaves shows rank, state, step, loss and samples/s whole
(nothing cut to ``…``), and the run's outcome."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

JOB = Path(__file__).parent / "jobs" / "plain" / "job.yaml"
REPO = Path(__file__).resolve().parents[2]


def test_the_final_screen_at_80_columns_keeps_the_important_columns(
    cli: Cli, tmp_path: Path
) -> None:
    session = f"dmlctl-test-{tmp_path.name}"
    done = tmp_path / "done"
    command = (
        f"cd {shlex.quote(str(REPO))} && DMLCTL_HOME={shlex.quote(str(cli.home))} "
        f"{shlex.quote(sys.executable)} -m dmlctl launch {shlex.quote(str(JOB))} --ui live; "
        f"echo $? > {shlex.quote(str(done))}; sleep 120"
    )
    tmux = ["tmux", "-L", session]
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "80", "-y", "24", command])
    try:
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert done.read_text().strip() == "0", screen
    lines = screen.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["host"] or "rank" in line.split())
    for column in ("rank", "state", "step", "loss", "samples/s"):
        assert column in header.split(), screen
    rows = [line for line in lines if line.split()[:1] == ["local"]]
    cut = header.find("last line") if "last line" in header else len(header)
    assert len(rows) == 2 and not any("…" in row[:cut] for row in rows), screen
    assert all("succeeded" in row.split() for row in rows), screen
    assert all(len(line) <= 80 for line in lines)
