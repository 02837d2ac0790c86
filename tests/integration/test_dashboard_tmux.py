"""The live dashboard in a real terminal: ``dmlctl launch --ui live`` inside an 80×24
tmux session; the screen it leaves shows rank, state, step, loss and samples/s whole
(nothing cut to ``…``), and the run's outcome: a run of ranks that report no metrics,
and one whose rank 1 fails at step 3 (loss 1/3) while rank 0 is stopped."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
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
        ("fail", 1, [["stopped", "(peer", "failed)"], ["failed", "(1)", "3", "0.3333"]]),
    ],
)
def test_the_final_screen_at_80_columns_keeps_the_important_columns(
    cli: Cli, tmp_path: Path, job: str, code: int, cells: list[list[str]]
) -> None:
    """``cells``: words each rank's row must hold after its rank number, in order."""
    done, screen = _run_in_tmux(cli, tmp_path, JOBS / job / "job.yaml", 80, 24)
    assert done.read_text().strip() == str(code), screen
    lines = screen.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["host"] or "rank" in line.split())
    for column in ("host", "rank", "state", "step", "loss", "samples/s"):  # host: kept at 80
        assert column in header.split(), screen
    if job == "plain":  # it never called ctx.prepare: the header says so, not its ssgd
        assert "strategy none" in screen, screen
    rows = [line for line in lines if line.split()[:1] == ["local"]]
    cut = header.find("last line") if "last line" in header else len(header)
    assert len(rows) == 2 and not any("…" in row[:cut] for row in rows), screen
    for row, words in zip(rows, cells, strict=True):
        after_rank = row.split()[3:]  # host, rank, role
        assert after_rank[: len(words)] == words, screen
    assert all(len(line) <= 80 for line in lines)
    assert "Root Cause" not in screen and "ChildFailedError" not in screen, screen  # torchrun's


def test_ctrl_c_in_a_short_terminal_leaves_one_header(cli: Cli, tmp_path: Path) -> None:
    """80×9: the view (header, table, log) is taller than the terminal, so every frame
    is cut to fit; Ctrl-C leaves the final frame once, not under a stale header."""

    def running(screen: str) -> bool:
        return any(
            line.split()[3:4] == ["running"] and "-" not in line.split()[4:5]
            for line in screen.splitlines()
        )

    done, screen = _run_in_tmux(
        cli, tmp_path, JOBS / "forever" / "job.yaml", 80, 9, interrupt_when=running
    )
    assert done.read_text().strip() == "130", screen
    lines = screen.splitlines()
    assert sum(line.startswith("run ") for line in lines) == 1, screen
    assert any(line.startswith("stopped") for line in lines), screen
    assert len([line for line in lines if line.split()[:1] == ["local"]]) >= 1, screen


def _run_in_tmux(
    cli: Cli,
    tmp_path: Path,
    spec: Path,
    width: int,
    height: int,
    interrupt_when: Callable[[str], bool] | None = None,
) -> tuple[Path, str]:
    """Run ``dmlctl launch SPEC --ui live`` in a ``width``×``height`` tmux session; with
    ``interrupt_when``, press Ctrl-C once the screen satisfies it, and capture what
    scrolled off the screen too. Returns the file the exit code goes to and the screen
    after the command ended."""
    # A socket of this call's own: a stale one left by an earlier run (same test name)
    # can make `new-session` fail.
    session = f"dmlctl-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    done = tmp_path / "done"
    # A tmux server started from here hands its panes LINES=24 and COLUMNS=80, which
    # rich would take over the pane's real size; a user's terminal does not set them.
    command = (
        f"cd {shlex.quote(str(REPO))} && unset LINES COLUMNS && "
        f"DMLCTL_HOME={shlex.quote(str(cli.home))} "
        f"{shlex.quote(sys.executable)} -m dmlctl launch {shlex.quote(str(spec))} --ui live; "
        f"echo $? > {shlex.quote(str(done))}; sleep 120"
    )
    tmux = ["tmux", "-L", session]
    size = ["-x", str(width), "-y", str(height)]
    subprocess.run([*tmux, "new-session", "-d", "-s", session, *size, command], check=True)

    def capture() -> str:
        history = [] if interrupt_when is None else ["-S", "-100"]
        argv = [*tmux, "capture-pane", "-p", *history, "-t", session]
        return subprocess.run(argv, capture_output=True, text=True).stdout

    try:
        deadline = time.monotonic() + 120
        while interrupt_when is not None and time.monotonic() < deadline:
            if interrupt_when(capture()):
                subprocess.run([*tmux, "send-keys", "-t", session, "C-c"], check=True)
                break
            time.sleep(0.5)
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        return done, capture()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
