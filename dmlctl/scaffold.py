"""``dmlctl init``: copy the project templates into a directory."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from dmlctl.errors import UsageError

TEMPLATES = ("cluster.yaml", "job.yaml", "train.py")


def write_project(directory: Path, *, force: bool) -> list[Path]:
    """Write every template into ``directory`` (created if missing).

    Refuses — writing nothing — when any target exists and ``force`` is False.
    """
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory}: exists and is not a directory")
    targets = [directory / name for name in TEMPLATES]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        verb = "exists" if len(existing) == 1 else "exist"
        raise UsageError(f"{', '.join(existing)} already {verb}; use --force to overwrite")
    directory.mkdir(parents=True, exist_ok=True)
    source = resources.files("dmlctl") / "templates"
    for name, target in zip(TEMPLATES, targets, strict=True):
        target.write_text((source / name).read_text(encoding="utf-8"), encoding="utf-8")
    return targets
