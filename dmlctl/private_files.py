"""The run's files and folders are the user's alone: the modes dmlctl gives them, and
how it makes them (torch-free; every layer writes some)."""

from __future__ import annotations

import os

PRIVATE_FILE = 0o600
"""Mode of every file dmlctl writes for a run (rank logs, records, checkpoints)."""

PRIVATE_DIR = 0o700
"""Mode of every folder dmlctl makes for a run."""


def private_opener(path: str, flags: int) -> int:
    """``opener`` for :func:`open`: a new file gets :data:`PRIVATE_FILE`."""
    return os.open(path, flags, PRIVATE_FILE)


def make_private_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, but *every* folder it creates, parents
    included, gets :data:`PRIVATE_DIR` (``os.makedirs`` gives the mode to the last one
    only); folders that exist are left as they are."""
    path = os.path.normpath(path)
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        make_private_dirs(parent)
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def file_in_the_way(path: str) -> str | None:
    """Why :func:`make_private_dirs` cannot make ``path`` a directory: it, or a folder
    on the way to it, is a file. None when it can (as far as files go)."""
    path = os.path.normpath(path)
    found = path
    while not os.path.lexists(found) and found != os.path.dirname(found):
        found = os.path.dirname(found)
    if not os.path.lexists(found) or os.path.isdir(found):
        return None
    return f"{found} is a file, not a directory"  # the path itself, or a folder above it
