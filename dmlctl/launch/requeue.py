"""A Slurm run's allocation as it changes (:class:`Reallocation`): whether Slurm ended
it, and — with ``slurm.requeue``, when it ended early (time limit, preemption, a failed
node) — the same request granted again, the run's hosts bound to the new nodes, their
transports swapped in place, and the new allocation recorded in the run directory
(``allocation.json``, which ``status``, ``stop`` and ``--resume`` read)."""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from pathlib import Path

from dmlctl.plan.elastic import rebind
from dmlctl.plan.model import LaunchPlan
from dmlctl.slurm import allocation
from dmlctl.slurm.allocation import Allocation, JobState
from dmlctl.slurm.commands import SlurmError
from dmlctl.slurm.transport import Node, SrunTransport
from dmlctl.transport.base import Transport

CURRENT = "allocation.json"


def current(run_dir: Path, planned: Allocation | None) -> Allocation | None:
    """The run's allocation now: the one a requeue recorded in ``run_dir``, else the
    planned one."""
    try:
        data = json.loads((run_dir / CURRENT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return planned
    return Allocation(**{**data, "nodes": dict(data["nodes"]), "sbatch": tuple(data["sbatch"])})


class Reallocation:
    """The allocation of a running run (see the module docstring)."""

    def __init__(
        self, run_dir: Path, where: Allocation, transports: MutableMapping[str, Transport]
    ) -> None:
        self.run_dir, self.where, self.transports = run_dir, where, transports

    def ended(self) -> tuple[str, str] | None:
        """How the allocation ended (Slurm's state, why in words); None while it runs."""
        return allocation.ended(self.where)

    def may_requeue(self, state: str) -> bool:
        """Whether an end in ``state`` is answered with a new allocation."""
        return (
            self.where.requeue and bool(self.where.sbatch) and state in allocation.REQUEUED_STATES
        )

    def again(
        self,
        plan: LaunchPlan,
        note: Callable[[str], None],
        stopping: Callable[[], bool] = lambda: False,
    ) -> LaunchPlan:
        """Ask Slurm again with the same request (as long as it queues; ``note`` is
        told how it waits); ``plan`` with its hosts and spares on the new nodes. Raises
        SlurmError when Slurm refuses or gives fewer nodes, WaitStopped (the job
        cancelled) when ``stopping()`` turns true while it queues."""
        old = self.where

        def waiting(now: JobState) -> None:
            why = f" ({now.reason})" if now.reason else ""
            note(f"slurm.requeue: waiting for the new allocation: {now.state.lower()}{why}")

        got = allocation.allocate(
            list(old.sbatch), plan.job_name, old.conf, waiting, stopping=stopping
        )
        names = list(old.nodes)
        if len(got.nodes) < len(names):
            allocation.cancel(got.job_id, old.conf)
            raise SlurmError(f"Slurm job {got.job_id} has {len(got.nodes)} nodes, not {len(names)}")
        where = old.moved(got.job_id, dict(zip(names, got.nodes, strict=False)))
        for name in names:
            self.transports[name] = SrunTransport(name, Node.of(where, name))
        self.where = where
        record = {**where.__dict__, "nodes": dict(where.nodes), "sbatch": list(where.sbatch)}
        (self.run_dir / CURRENT).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        note(f"slurm.requeue: Slurm job {got.job_id} on {', '.join(got.nodes)}")
        return rebind(plan, where, {n: got.addresses[where.nodes[n]] for n in names})
