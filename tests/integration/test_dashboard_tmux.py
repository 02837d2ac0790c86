"""The live dashboard in a real terminal: ``dmlctl launch --ui live`` inside an 80×24
tmux session; the screen it leaves shows rank, state, step, loss and samples/s whole
(nothing cut to ``…``), and the run's outcome: a run of ranks that report no metrics,
and one whose rank 1 fails at step 3 (loss 1/3) while rank 0 is stopped."""

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

JOBS = Path(__file__).parent / "jobs"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("job", "code", "cells"),
    [
        ("plain", 0, [["succeeded", "-", "-"], ["succeeded", "-", "-"]]),
        ("fail", 1, [["stopped"], ["failed", "(1)", "3", "0.3333"]]),
    ],
)
def test_the_final_screen_at_80_columns_keeps_the_important_columns(
    cli: Cli, tmp_path: Path, job: str, code: int, cells: list[list[str]]
) -> None:
    """``cells``: words each rank's row must hold after its rank number, in order."""
    session = f"dmlctl-test-{tmp_path.name}"
    done = tmp_path / "done"
    spec = JOBS / job / "job.yaml"
    command = (
        f"cd {shlex.quote(str(REPO))} && DMLCTL_HOME={shlex.quote(str(cli.home))} "
        f"{shlex.quote(sys.executable)} -m dmlctl launch {shlex.quote(str(spec))} --ui live; "
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
    assert done.read_text().strip() == str(code), screen
    lines = screen.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["host"] or "rank" in line.split())
    for column in ("rank", "state", "step", "loss", "samples/s"):
        assert column in header.split(), screen
    rows = [line for line in lines if line.split()[:1] == ["local"]]
    cut = header.find("last line") if "last line" in header else len(header)
    assert len(rows) == 2 and not any("…" in row[:cut] for row in rows), screen
    for row, words in zip(rows, cells, strict=True):
        after_rank = row.split()[3:]  # host, rank, role
        assert after_rank[: len(words)] == words, screen
    assert all(len(line) <= 80 for line in lines)
