"""The names of dmlctl's steps in an allocation (``srun --job-name``:
``dmlctl-WHAT-PID-N``, unique to one step of one dmlctl process), and ending steps by
those names: one step whose node may not answer, or every step one process started."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable

from dmlctl.slurm.commands import best_effort

_numbers = itertools.count(1)


def step_name(what: str) -> str:
    """A step name no other step of this process has (so that ending one step never
    ends another, such as a host's standby agent beside its agent)."""
    return f"dmlctl-{what}-{os.getpid()}-{next(_numbers)}"


def cancel_step(job_id: str, step_name: str, conf: str | None) -> None:
    """SIGKILL the allocation's steps named ``step_name``. Never raises."""
    _kill_steps(job_id, conf, lambda name: name == step_name)


def cancel_steps(job_id: str, conf: str | None, pid: int) -> None:
    """SIGKILL the allocation's steps that dmlctl process ``pid`` started (named by
    :func:`step_name` there). Never raises."""
    mine = re.compile(rf"dmlctl-.*-{pid}-\d+")
    _kill_steps(job_id, conf, lambda name: mine.fullmatch(name) is not None)


def _kill_steps(job_id: str, conf: str | None, chosen: Callable[[str], bool]) -> None:
    steps = best_effort(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"], conf) or ""
    for line in steps.splitlines():
        step, _, name = line.strip().partition("|")
        if chosen(name):
            best_effort(["scancel", "--signal=KILL", step], conf)
