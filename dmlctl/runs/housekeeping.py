"""Choosing runs to show and removing old ones: ``dmlctl status`` filters, ``dmlctl
rm`` and ``dmlctl prune``.

* :func:`select` reads only what it shows: the newest runs first, by the time stamp
  in their ids (no file read), a state file only for a run that may be listed, and
  it stops once ``limit`` runs matched — so ``status`` costs the same with 20 runs
  or 1,000.
* :func:`remove` deletes a run directory, never one whose controller still runs.
* :func:`prune` removes the finished runs (succeeded, failed, stopped) that ended
  before a cut-off; ``lost`` runs (their controller died; they may be resumed) are
  kept and counted.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

from dmlctl.errors import UsageError
from dmlctl.runs.state import Phase
from dmlctl.runs.store import RunDir, RunListing, RunStore, RunUnreadable

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
FINISHED = (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED)


def parse_age(text: str) -> float:
    """``30m``, ``12h``, ``7d``, ``2w`` (or seconds, ``90s``) → seconds; UsageError
    for anything else."""
    m = _AGE.match(text)
    if m is None:
        raise UsageError(
            f"--older-than: expected a number and a unit (s, m, h, d, w), got {text!r}"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True)
class Selection:
    """What ``status`` lists (newest first) and how many runs the store holds."""

    rows: list[RunListing]
    total: int
    more: bool = False  # older runs were not looked at (the limit was reached)


@dataclass(frozen=True)
class Filters:
    """``status`` filters; an empty one matches every run."""

    phases: tuple[Phase, ...] = ()
    name: str | None = None


def select(store: RunStore, filters: Filters, limit: int | None) -> Selection:
    """The newest runs matching ``filters``, at most ``limit`` (None: all), newest
    first; see the module docstring for what is read."""
    everything = list(store.runs())
    runs = everything[::-1]
    if filters.name is not None:
        runs = [r for r in runs if _job_of(r.run_id) == filters.name]
    rows: list[RunListing] = []
    for run in runs:
        if limit is not None and len(rows) == limit:
            return Selection(rows, len(everything), more=True)
        row = _read(run)
        if not filters.phases or (row.state is not None and row.state.phase in filters.phases):
            rows.append(row)
    return Selection(rows, len(everything))


def _read(run: RunDir) -> RunListing:
    try:
        return RunListing(run.run_id, run.read_state())
    except RunUnreadable as e:
        return RunListing(run.run_id, None, e.reason)


def _job_of(run_id: str) -> str:
    """The job part of ``<job>-<YYYYmmdd-HHMMSS>-<hex>``."""
    parts = run_id.rsplit("-", 3)
    return parts[0] if len(parts) == 4 else run_id


def remove(run: RunDir) -> None:
    """Delete ``run``'s directory; UsageError (nothing removed) while its controller
    runs."""
    if run.controller_alive():
        raise UsageError(
            f"run {run.run_id} is still running; stop it first: dmlctl stop {run.run_id}"
        )
    shutil.rmtree(run.path)


@dataclass(frozen=True)
class Pruned:
    """What :func:`prune` did: the runs removed and the lost runs it kept."""

    removed: list[str]
    kept_lost: list[str]


def prune(store: RunStore, older_than_s: float, now: float, dry_run: bool = False) -> Pruned:
    """Remove every finished run that ended more than ``older_than_s`` seconds before
    ``now`` (unreadable and lost runs are kept; see the module docstring)."""
    removed, lost = [], []
    for run in store.runs():
        row = _read(run)
        state = row.state
        if state is None:
            continue
        if state.phase is Phase.LOST:
            lost.append(run.run_id)
            continue
        ended = state.ended_at if state.ended_at is not None else state.created_at
        if state.phase in FINISHED and now - ended > older_than_s and not run.controller_alive():
            if not dry_run:
                shutil.rmtree(run.path)
            removed.append(run.run_id)
    return Pruned(removed, lost)
