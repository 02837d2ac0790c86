"""The lab's block in ``~/.ssh/known_hosts``, between two marker lines, so that
``dmlctl launch`` trusts the lab's hosts and ``lab down`` removes exactly what ``up``
added. Other lines are kept as they are."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

BEGIN = "# dmlctl lab begin"
END = "# dmlctl lab end"


def default_file() -> Path:
    return Path("~/.ssh/known_hosts").expanduser()


def without_block(text: str) -> str:
    """``text`` less every line from :data:`BEGIN` to :data:`END` (both included)."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END and inside:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def set_block(path: Path, lines: Sequence[str]) -> None:
    """``path`` with the lab's block replaced by ``lines`` (removed when empty); the
    file and its directory are made (0600 / 0700) when missing."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    kept = without_block(text)
    if lines:
        if kept and not kept.endswith("\n"):
            kept += "\n"
        kept += "\n".join([BEGIN, *lines, END]) + "\n"
    if not path.exists() and not lines:
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".dmlctl-tmp")
    tmp.write_text(kept, encoding="utf-8")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
