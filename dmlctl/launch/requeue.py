"""A Slurm run's allocation as it changes (:class:`Reallocation`): whether Slurm ended
it, and — with ``slurm.requeue``, when it ended early (time limit, preemption, a failed
node) — the same request granted again, the run's hosts bound to the new nodes, their
transports swapped in place, and the new allocation recorded in the run directory
(:mod:`dmlctl.slurm.record`, which ``status``, ``stop``, ``--resume`` and ``logs
--fetch`` read)."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from pathlib import Path

from dmlctl.failure import CONTROLLER, Evidence, Failure, Kind
from dmlctl.plan.elastic import rebind, replan
from dmlctl.plan.model import LaunchPlan
from dmlctl.runs.events import AgentExited
from dmlctl.slurm import allocation
from dmlctl.slurm.allocation import Allocation, JobState
from dmlctl.slurm.record import note_pending, record, recorded
from dmlctl.slurm.transport import Node, SrunTransport
from dmlctl.transport.base import Transport


class Reallocation:
    """The allocation of a running run (see the module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        where: Allocation,
        transports: MutableMapping[str, Transport],
        prepare: Callable[[LaunchPlan], None] | None = None,
    ) -> None:
        self.run_dir, self.where, self.transports = run_dir, where, transports
        self.prepare = prepare  # readies the new nodes (code, setup) before they run
        #: The job whose coming time limit stopped the run's ranks (``warn_s``).
        self.warned: str | None = None

    def warned_now(self) -> bool:
        """Whether the current allocation's coming time limit stopped the ranks."""
        return self.warned == self.where.job_id

    def ended(self, stopping: Callable[[], bool] = lambda: False) -> tuple[str, str] | None:
        """How the allocation ended (Slurm's state, why in words); None while it runs
        (an ending one is waited for until it says, or until ``stopping()``)."""
        return allocation.ended(self.where, stopping=stopping)

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
        """Cancel the allocation (one warned of its time limit still runs) and ask Slurm
        again with the same request (as long as it queues; ``note`` is told how it
        waits), then ready its nodes (``prepare``: the code synced, the setup run);
        ``plan`` with its hosts and spares on the new nodes. Raises SlurmError when
        Slurm refuses or gives fewer nodes, WaitStopped (the job cancelled) when
        ``stopping()`` turns true while it queues, and what ``prepare`` raises."""
        old = self.where
        allocation.cancel(old.job_id, old.conf)  # one warned of its end still holds nodes

        def waiting(now: JobState) -> None:
            note(f"slurm.requeue: waiting for the new allocation: {now.said}")

        got = allocation.allocate(
            list(old.sbatch),
            plan.job_name,
            old.conf,
            waiting,
            lambda job_id: note_pending(self.run_dir, job_id),
            stopping,
            need=len(old.nodes),
        )
        names = list(old.nodes)
        try:
            where = old.moved(got.job_id, dict(zip(names, got.nodes, strict=False)))
            record(self.run_dir, where)  # before anything runs there: stop and status see it
        except OSError:
            allocation.cancel(got.job_id, old.conf)
            raise
        finally:
            note_pending(self.run_dir, None)
        for name in names:
            self.transports[name] = SrunTransport(name, Node.of(where, name))
        self.where = where
        note(f"slurm.requeue: Slurm job {got.job_id} on {', '.join(got.nodes)}")
        moved = rebind(plan, where, {n: got.addresses[where.nodes[n]] for n in names})
        if self.prepare is not None:
            note("slurm.requeue: syncing the job and running its setup on the new nodes")
            self.prepare(moved)
        return moved


def allocation_end(kind: Kind, why: str, now: float) -> AgentExited:
    """The event of the run's allocation ending (``kind``: ALLOCATION, or REQUEUED
    when a new one is asked for), said ``why``: the root cause of every death it
    causes."""
    name = "AllocationRequeued" if kind is Kind.REQUEUED else "AllocationEnded"
    cause = Failure(CONTROLLER, None, name, why, (), now, kind=kind, evidence=Evidence.SEEN)
    return AgentExited(CONTROLLER, 1, (), now, cause)


def moved_plan(run_dir: Path, plan: LaunchPlan) -> LaunchPlan:
    """``plan`` on the allocation a requeue recorded in ``run_dir`` (its hosts at the
    new nodes' addresses, meeting on the new first node at the planned port); ``plan``
    itself when there is none."""
    where = recorded(run_dir, plan.allocation)
    if where is None or where == plan.allocation:
        return plan
    addresses = allocation.node_addresses(list(where.nodes.values()), where.conf)
    moved = rebind(plan, where, {h: addresses[n] for h, n in where.nodes.items()})
    port = plan.rdzv_endpoint.rpartition(":")[2]
    return replan(moved, [h.name for h in moved.hosts], f"{moved.hosts[0].address}:{port}")
