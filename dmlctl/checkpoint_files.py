"""Files of a checkpoint directory, torch-free: shared by the ranks' checkpoint manager
(:mod:`dmlctl.runtime.checkpoint`) and the controller's copies of it
(:mod:`dmlctl.provision.replicate`), so both read and commit the same layout.

Layout names are in :mod:`dmlctl.protocol` (``CHECKPOINT_*``).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from dmlctl.private_files import private_opener
from dmlctl.protocol import CHECKPOINT_LATEST, CHECKPOINT_STEP_PATTERN

_STEP_DIR = re.compile(CHECKPOINT_STEP_PATTERN)


def step_of(name: str) -> int | None:
    """The step a ``step-<N>`` directory name stands for, or None for any other name."""
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Committed-looking step directories under ``root``, newest first (none when
    ``root`` does not exist)."""
    found = []
    for p in root.iterdir() if root.is_dir() else []:
        step = step_of(p.name)
        if step is not None and p.is_dir():
            found.append((step, p))
    return sorted(found, reverse=True)


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path`` (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: its entries, e.g. after a rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def point_latest(root: Path, name: str) -> None:
    """Make ``root/LATEST`` name ``name``, atomically and durably: a synced temporary
    file replaces it, then ``root`` itself is synced. ``LATEST`` is never absent."""
    tmp = root / f".tmp-{CHECKPOINT_LATEST}"
    try:
        with open(tmp, "wb", opener=private_opener) as f:
            f.write(name.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / CHECKPOINT_LATEST)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(root)
