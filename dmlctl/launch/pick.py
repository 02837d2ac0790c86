"""Which scheduler runs a launch (:func:`scheduler_for`, from the cluster) and which
answers for a recorded run (:func:`scheduler_of`, from its plan)."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from dmlctl.errors import DmlctlError
from dmlctl.launch.options import LaunchOptions
from dmlctl.launch.schedulers import (
    LocalScheduler,
    RecordedRunBase,
    RecordedRuns,
    Scheduler,
    SshScheduler,
)
from dmlctl.launch.slurm_scheduler import SlurmScheduler
from dmlctl.runs.store import RunDir
from dmlctl.slurm.record import recorded
from dmlctl.spec.models import ClusterSpec
from dmlctl.spec.slurm import SlurmSpec


def scheduler_for(cluster: ClusterSpec, options: LaunchOptions, console: Console) -> Scheduler:
    """The scheduler a launch on ``cluster`` uses: Slurm for ``scheduler: slurm``, SSH
    when any host is remote, else this machine."""
    if (slurm := cluster.slurm_spec) is not None:
        return SlurmScheduler(options, (console, Console(stderr=True, highlight=False)), slurm)
    if any(not h.is_local for h in cluster.resolved_hosts()):
        return SshScheduler(options, (console, Console(stderr=True, highlight=False)))
    return LocalScheduler(options, console)


class _Unplanned(RecordedRunBase):
    """A run whose plan cannot be read: it can still be stopped and its logs read."""

    def __init__(self, why: str) -> None:
        self._why = why

    def describe(self, run: RunDir) -> list[str]:
        return [f"where: unknown ({self._why})"]


def scheduler_of(run: RunDir) -> RecordedRuns:
    """The scheduler that ran a recorded run (for describe, cancel and logs), from its
    plan; one that can still stop it when the plan cannot be read."""
    console = Console(stderr=True, highlight=False)
    try:
        plan = run.read_plan()
    except (DmlctlError, OSError, ValueError) as e:
        return _Unplanned(str(e))
    plan = dataclasses.replace(plan, allocation=recorded(run.path, plan.allocation))
    if plan.allocation is not None:
        spec = SlurmSpec(conf=plan.allocation.conf)
        return SlurmScheduler(LaunchOptions(), (console, console), spec, plan)
    if any(not h.is_local for h in (*plan.hosts, *plan.spares)):
        return SshScheduler(LaunchOptions(), (console, console), plan)
    return LocalScheduler(LaunchOptions(), console)
