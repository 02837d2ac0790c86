"""Secrets hidden in the text files of a run directory, rewritten in place.

The ranks write their output files themselves, as they print, so a secret a script
prints is in them until they are masked: the host agent masks its attempt's files when
its ranks are gone, and the controller masks the whole run directory when the run ends
(those collected from the other hosts too).
"""

from __future__ import annotations

import os
from pathlib import Path

from dmlctl.redact import Redactor

TEXT_FILES = (".log", ".stdout", ".stderr", ".jsonl", ".json", ".txt", ".yaml")
"""The files of a run directory that :func:`mask_files` reads: text dmlctl or a rank
wrote (never a checkpoint's tensors)."""
KEPT = ("secrets.json",)
"""What :func:`mask_files` leaves as it is: where the real values must stay."""


def mask_files(root: Path, redactor: Redactor, deep: bool = True) -> list[Path]:
    """Hide the secrets ``redactor`` knows in every text file under ``root`` (only those
    directly in it unless ``deep``); each file changed is rewritten, line by line, in
    place of the old one, with its mode. Read in pieces: a flood of lines costs no
    memory. Returns the files changed."""
    changed = []
    for path in sorted(root.rglob("*") if deep else root.glob("*")):
        if path.suffix not in TEXT_FILES or path.name in KEPT or not path.is_file():
            continue
        try:
            if _needs(path, redactor):
                _rewrite(path, redactor)
                changed.append(path)
        except OSError:
            continue  # gone meanwhile, or unreadable: nothing dmlctl wrote
    return changed


_PIECE = 1 << 20
_OVERLAP = 8192  # more than any secret dmlctl knows (a job's secrets: 4096 at most)


def _needs(path: Path, redactor: Redactor) -> bool:
    """Whether ``path`` holds a secret, read a piece at a time (pieces overlap, so a
    secret across two is seen)."""
    tail = ""
    with open(path, "rb") as f:
        while piece := f.read(_PIECE):
            text = tail + piece.decode("utf-8", "surrogateescape")
            if redactor.needed(text):
                return True
            tail = text[-_OVERLAP:]
    return False


def _rewrite(path: Path, redactor: Redactor) -> None:
    """``path`` with its secrets hidden, line by line, replaced whole."""
    tmp = path.with_name(f".{path.name}.masking-{os.getpid()}")  # the agent's, or the controller's
    with open(path, "rb") as src, open(tmp, "wb") as out:
        for line in src:
            text = line.decode("utf-8", "surrogateescape")
            out.write(redactor.text(text).encode("utf-8", "surrogateescape"))
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
