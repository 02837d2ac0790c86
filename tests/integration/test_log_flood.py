"""Every line arrives, with the controller's memory bounded: two ranks printing as
fast as they can, in both UI modes; the plain view's 2 × 1,000,000 lines while other
processes load every core too. (The two ranks, the agent relaying their lines and the
controller are already more busy processes than 2 cores: the controller reads behind
them in the live view's run without a burner of its own.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cli

pytestmark = pytest.mark.integration
JOB_DIR = Path(__file__).parent / "jobs" / "flood"
MAX_RSS_MB = 150
# Runs the CLI and reports the controller's peak memory when it is done: VmHWM, the
# peak of this process's own memory (getrusage's maxrss can carry the parent's peak
# over a vfork + exec).
PEAK = (
    "import sys\n"
    "from dmlctl.cli.app import main\n"
    "code = main(sys.argv[1:])\n"
    "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
    "print('maxrss_kb', hwm[0], file=sys.stderr)\n"
    "sys.exit(code)\n"
)


@pytest.fixture
def load() -> Iterator[None]:
    """CPU-burning processes, one fewer than the cores (at least one): with the two
    ranks printing as fast as they can, more busy processes than cores, so the
    controller reads behind them. (More burners only took the cores from the suite's
    other xdist worker.)"""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(max(1, (os.cpu_count() or 1) - 1))
    ]
    yield
    for p in procs:
        p.kill()
        p.wait()


def _flood(cli: Cli, tmp_path: Path, lines: int, ui: str) -> tuple[Path, float]:
    job = tmp_path / "flood.yaml"
    job.write_text(f"script: train.py\nworkdir: {JOB_DIR}\nworkers: 2\nargs: ['{lines}']\n")
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.run(
            [sys.executable, "-c", PEAK, "launch", str(job), "--ui", ui],
            env=cli.env,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=900,
        )
    assert proc.returncode == 0, proc.stderr
    peak = next(line for line in proc.stderr.splitlines() if line.startswith("maxrss_kb"))
    return cli.runs()[-1], int(peak.split()[1]) / 1024


def _assert_complete(run: Path, lines: int) -> None:
    """Every rank's log holds its lines, in order, the last one included."""
    for rank in (0, 1):
        with open(run / "logs" / f"rank-{rank}.log", encoding="utf-8") as f:
            for i, line in enumerate(f):
                assert line == f"r{rank} line {i}\n", (rank, i, line)
        assert i == lines - 1, (rank, i + 1)


def test_two_million_lines_under_load_all_arrive_in_bounded_memory(
    cli: Cli, tmp_path: Path, load: None
) -> None:
    lines = 1_000_000
    run, peak_mb = _flood(cli, tmp_path, lines, "plain")
    _assert_complete(run, lines)
    with open(tmp_path / "out.txt", encoding="utf-8") as f:
        printed = sum(1 for line in f if line.startswith("[rank "))
    assert printed == 2 * lines  # the plain view printed every line too
    assert peak_mb <= MAX_RSS_MB, peak_mb


def test_the_live_view_loses_nothing_from_the_files(cli: Cli, tmp_path: Path) -> None:
    lines = 300_000
    run, peak_mb = _flood(cli, tmp_path, lines, "live")
    _assert_complete(run, lines)
    assert peak_mb <= MAX_RSS_MB, peak_mb
