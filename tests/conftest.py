"""Shared fixtures: an isolated DMLCTL_HOME and a way to run the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Cli:
    """Runs ``python -m dmlctl`` as a user would, with its own DMLCTL_HOME."""

    home: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DMLCTL_HOME": str(self.home), "COLUMNS": "160"}

    def run(
        self, *args: str, cwd: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dmlctl", *args],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def popen(self, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "dmlctl", *args],
            cwd=cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def runs(self) -> list[Path]:
        root = self.home / "runs"
        if not root.is_dir():
            return []
        return sorted(p for p in root.iterdir() if (p / "state.json").is_file())

    def state(self, run_id: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.home / "runs" / run_id / "state.json").read_text())
        return data


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    home = tmp_path / "home"
    yield Cli(home)
