"""What Slurm says that a run reads but does not act on: a partition's line for the
doctor, and the seconds until a job's end time."""

from __future__ import annotations

import time

from dmlctl.slurm.commands import SlurmRefused, run


def seconds_until(end_time: str, now: float) -> float | None:
    """Seconds from ``now`` (epoch) to squeue's end time (``%e``, this machine's local
    time); None when it has none (``N/A``, ``Unknown``, ``NONE``)."""
    try:
        end = time.mktime(time.strptime(end_time, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return end - now


def partition_said(partition: str | None, conf: str | None) -> str:
    """What ``sinfo`` says of ``partition`` (None: Slurm's default one), in one line:
    ``partition lab: up, 3 nodes (2 idle, 1 mixed)``. SlurmError when sinfo fails;
    SlurmRefused when Slurm has no such partition."""
    argv = ["sinfo", "-a", "-h", "-o", "%P|%a|%D|%T"]  # -a: hidden ones too (-p hides them)
    rows = [ln.split("|") for ln in run(argv, conf).stdout.splitlines() if ln.count("|") == 3]
    if partition is None:  # Slurm's default one is marked with a star
        rows = [r for r in rows if r[0].endswith("*")]
    else:
        rows = [r for r in rows if r[0].rstrip("*") == partition]
    if not rows:
        which = f"no partition {partition!r}" if partition else "no default partition"
        raise SlurmRefused(f"sinfo: Slurm has {which}")
    name, avail = rows[0][0].rstrip("*"), rows[0][1]
    counts = ", ".join(f"{n} {st}" for _, _, n, st in rows)
    total = sum(int(r[2]) for r in rows if r[2].isdigit())
    return f"partition {name}: {avail}, {total} nodes ({counts})"
