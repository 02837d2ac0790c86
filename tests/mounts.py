"""Real small file systems for full-disk tests."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``mount`` syntax: ``4m``) mounted at ``path`` while the
    block runs. Skips the test, saying why, where it cannot be mounted (not root, no
    permission in a container)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def resize(path: Path, size: str) -> None:
    """Grow (or shrink) the tmpfs mounted at ``path``."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)
