"""Which collectives this rank entered and which one it waits in, per process group,
read from PyTorch's flight recorder (``TORCH_FR_BUFFER_SIZE``): gloo's and, in
builds with NCCL, NCCL's own (its collectives of a group are a row of their own,
``<group>/nccl``).

The hang detector compares these counts across ranks: the rank that never entered
the collective the others wait in is the one holding the run up.

Promises: :func:`snapshot` never raises and never imports torch (it answers None
until the script has imported ``torch.distributed`` and joined a process group, or
when the flight recorder is off or unavailable in this PyTorch); it only reads.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from dmlctl.protocol import FR_ENV, NCCL_SUFFIX


def recorder_enabled(environ: Any = os.environ) -> bool:
    """Whether the flight recorder was asked to keep entries (buffer size > 0)."""
    for name in FR_ENV:
        raw = environ.get(name, "")
        if raw:
            try:
                return int(raw) > 0
            except ValueError:
                return False
    return False


def _groups(c10d: Any) -> dict[str, int]:
    """Name → size of every process group this rank belongs to."""
    out: dict[str, int] = {}
    for pg, name in dict(c10d._world.pg_names).items():
        ranks = c10d._world.pg_group_ranks.get(pg)
        out[str(name)] = len(ranks) if ranks is not None else 0
    return out


def _summarize(data: dict[str, Any], groups: dict[str, int], now_ns: int) -> dict[str, list[Any]]:
    """The rows of :func:`snapshot` for ``groups`` (name → size) from a recorder dump;
    entries of other groups (destroyed ones) are left out."""
    out: dict[str, list[Any]] = {g: [0, 0, None, None, size] for g, size in groups.items()}
    oldest: dict[str, dict[str, Any]] = {}
    for entry in data.get("entries", ()):
        group = str((entry.get("process_group") or [""])[0])
        if entry.get("is_p2p") or group not in out:
            continue
        seq = int(entry.get("collective_seq_id", 0))
        row = out[group]
        row[0] = max(row[0], seq)
        if entry.get("retired"):
            row[1] = max(row[1], seq)
        elif group not in oldest or seq < int(oldest[group]["collective_seq_id"]):
            oldest[group] = entry
    for group, status in (data.get("pg_status") or {}).items():
        if str(group) not in out:
            continue
        row = out[str(group)]
        row[0] = max(row[0], int(status.get("last_enqueued_collective", 0) or 0))
        row[1] = max(row[1], int(status.get("last_completed_collective", 0) or 0))
    for group, entry in oldest.items():
        row = out[group]
        row[1] = min(row[1], int(entry["collective_seq_id"]) - 1)
        op = str(entry.get("profiling_name", "collective")).split(":")[-1]
        age = max(0.0, (now_ns - int(entry.get("time_created_ns", now_ns))) / 1e9)
        row[2], row[3] = op, round(age, 3)
    return out


def snapshot() -> dict[str, list[Any]] | None:
    """``{group: [entered, completed, op, age_s, size]}`` for every process group of
    this rank: the sequence numbers of the last collective it entered and completed
    there, the oldest one still pending (op name and seconds since it was entered) or
    nulls, and the group's size; None when unknown (see the module promises)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not recorder_enabled():
        return None
    try:
        if not dist.is_available() or not dist.is_initialized():
            return None
        c10d = sys.modules["torch.distributed.distributed_c10d"]
        groups = _groups(c10d)
        if not groups:
            return None  # torn down
        c = sys.modules["torch._C._distributed_c10d"]
        now = time.time_ns()
        raw = c._dump_fr_trace_json(includeCollectives=True)
        return {**_summarize(json.loads(raw), groups, now), **_nccl_rows(c, groups, now)}
    except Exception:
        return None


def _nccl_rows(c: Any, groups: dict[str, int], now_ns: int) -> dict[str, list[Any]]:
    """The rows of the groups whose NCCL backend has entered a collective, keyed
    ``<group>/nccl``: NCCL keeps its own recorder (``_dump_nccl_trace_json``, only in
    builds with NCCL) and numbers its collectives apart from gloo's, so a group that
    carries both (``cpu:gloo,cuda:nccl``) has two rows. Empty where unknown."""
    dump = getattr(c, "_dump_nccl_trace_json", None)
    if dump is None:
        return {}
    try:
        rows = _summarize(json.loads(dump(includeCollectives=True)), groups, now_ns)
    except Exception:
        return {}
    return {f"{group}{NCCL_SUFFIX}": row for group, row in rows.items() if row[0] > 0}
