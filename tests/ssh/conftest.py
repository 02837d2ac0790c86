"""Fixtures for tests against real ``sshd`` servers on loopback (see ``lab.py``).

Without ``/usr/sbin/sshd`` these tests are skipped, unless ``CI`` is set: CI must
install openssh-server, so there they fail instead of hiding.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ssh.lab import SSHD, SshLab, start_lab


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ssh: talks to real sshd servers started on loopback")


@pytest.fixture(scope="session", autouse=True)
def _require_sshd() -> None:
    """Skip (locally) or fail (in CI) every test of this directory without sshd."""
    if SSHD.is_file():
        return
    reason = f"{SSHD} not found: install openssh-server to run the SSH lab tests"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: it must be installed)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    """Two trusted hosts (node-a, node-b) and a stranger, shared by the session.
    Tests must leave it as they found it; to change it, start a lab of your own."""
    lab = start_lab(tmp_path_factory.mktemp("ssh-lab"), n_hosts=2)
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture
def fresh_ssh_lab(tmp_path: Path) -> Iterator[SshLab]:
    """A lab of this test's own, free to be broken (e.g. ``rotate_host_key``)."""
    lab = start_lab(tmp_path / "ssh-lab", n_hosts=2)
    try:
        yield lab
    finally:
        lab.stop()
