"""What a run directory records of its Slurm allocation beyond its plan: the
allocation a requeue moved the run to (``allocation.json``, written whole or not at
all) and a requested one still queued (``allocation.pending``, so that ``stop`` and the
controller's end cancel it even when the controller dies meanwhile)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

from dmlctl.slurm.allocation import Allocation

CURRENT = "allocation.json"
PENDING = "allocation.pending"


def recorded(run_dir: Path, planned: Allocation | None) -> Allocation | None:
    """The run's allocation now: the one a requeue recorded in ``run_dir``, else the
    planned one (also when the record cannot be read). Its ``setup`` is the planned
    one's (the record keeps none: it may hold a secret, and a requeue never changes
    it)."""
    try:
        data = json.loads((run_dir / CURRENT).read_text(encoding="utf-8"))
        where = Allocation.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        return planned
    return dataclasses.replace(where, setup=planned.setup if planned is not None else None)


def record(run_dir: Path, where: Allocation) -> None:
    """Record ``where`` as the run's allocation, without its ``setup`` (replacing the
    file whole; OSError when the run directory cannot take it)."""
    data = dataclasses.asdict(dataclasses.replace(where, setup=None))
    _replace(run_dir / CURRENT, json.dumps(data, indent=2) + "\n")


def note_pending(run_dir: Path, job_id: str | None) -> None:
    """Record the job id of an allocation asked for and not yet granted (None: none)."""
    if job_id is None:
        with contextlib.suppress(FileNotFoundError):
            (run_dir / PENDING).unlink()
        return
    _replace(run_dir / PENDING, job_id + "\n")


def pending(run_dir: Path) -> str | None:
    """The job id of an allocation the run asked for and had not got yet, if any."""
    try:
        job_id = (run_dir / PENDING).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return job_id if job_id.isdigit() else None


def _replace(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)
