"""Fixtures for tests of ``dmlctl lab`` against real network namespaces, tc and sshd.

They need root, iproute2 and openssh-server, and a kernel that lets this process make
network namespaces; where that is not so they are skipped, saying why (the lab itself
says the same to a user). Every test runs the real CLI with a throw-away ``HOME`` (so
``~/.ssh/known_hosts`` is a file of the test's own) and ``DMLCTL_HOME``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cli

PROBE = "dmlctl-lab-testprobe"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    for tool in ("ip", "tc", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"the lab needs `{tool}` (iproute2, openssh-client)"
    if not Path("/usr/sbin/sshd").is_file():
        return "the lab needs /usr/sbin/sshd (openssh-server)"
    made = subprocess.run(["ip", "netns", "add", PROBE], capture_output=True, text=True)
    if made.returncode != 0:
        return f"network namespaces cannot be made here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", PROBE], capture_output=True)
    return None


@pytest.fixture(scope="session", autouse=True)
def _require_namespaces() -> None:
    why = _why_not()
    if why is not None:
        pytest.skip(why)


class LabCli(Cli):
    """The CLI with its own HOME too (``~/.ssh/known_hosts`` of the test's own)."""

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "HOME": str(self.home.parent / "user-home")}

    @property
    def known_hosts(self) -> Path:
        return self.home.parent / "user-home" / ".ssh" / "known_hosts"

    @property
    def lab_dir(self) -> Path:
        return self.home / "lab"


def lab_cli(root: Path) -> LabCli:
    (root / "user-home").mkdir(parents=True, exist_ok=True)
    return LabCli(root / "home")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCli]:
    """A 2-host lab at 20 Mbit/s, shared by a module's tests; removed after."""
    cli = lab_cli(tmp_path_factory.mktemp("lab"))
    proc = cli.run("lab", "up", "--hosts", "2", "--bandwidth", "20mbit")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        yield cli
    finally:
        cli.run("lab", "down")
