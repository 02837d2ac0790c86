"""Shared finished runs: one successful, one failed and one crashed run, launched once
per session (per pytest-xdist worker) into a home of their own, for the tests that only
read what a finished run left (status, logs, root cause, JSON). A test that changes a
run's files works on a copy (:meth:`FinishedRuns.copy_home`)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Cli

JOBS = Path(__file__).parent / "jobs"


class FinishedRun(NamedTuple):
    """A run that ended: its id and what its ``dmlctl launch`` printed and returned."""

    run_id: str
    proc: subprocess.CompletedProcess[str]


@dataclass(frozen=True)
class FinishedRuns:
    """The three runs of :func:`finished_runs`, all in ``cli.home``."""

    cli: Cli
    succeeded: FinishedRun  # jobs/plain (torchrun-style, 2 ranks), --ui quiet
    failed: FinishedRun  # jobs/fail: rank 1 raises ValueError at step 3, --ui plain
    crashed: FinishedRun  # jobs/crash: rank 1 dies of SIGSEGV, --ui plain

    def copy_home(self, dest: Path) -> Cli:
        """A CLI over a copy of this home, free to be changed."""
        shutil.copytree(self.cli.home, dest)
        return Cli(dest)


def _launch(cli: Cli, job: str, ui: str) -> FinishedRun:
    before = set(cli.runs())
    proc = cli.run("launch", str(JOBS / job / "job.yaml"), "--ui", ui)
    (new,) = set(cli.runs()) - before
    return FinishedRun(new.name, proc)


@pytest.fixture(scope="session")
def finished_runs(tmp_path_factory: pytest.TempPathFactory) -> FinishedRuns:
    """The session's shared finished runs (module docstring)."""
    cli = Cli(tmp_path_factory.mktemp("finished") / "home")
    return FinishedRuns(
        cli,
        succeeded=_launch(cli, "plain", "quiet"),
        failed=_launch(cli, "fail", "plain"),
        crashed=_launch(cli, "crash", "plain"),
    )
