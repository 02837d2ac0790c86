"""A Slurm cluster as a scheduler (:class:`SlurmScheduler`): one allocation per run,
asked for with ``sbatch`` when the launch gathers its facts, its nodes bound to the
plan's hosts (``node-0`` …), and every command — preflight, code sync, setup, the
host agents — run on a node as an ``srun`` step (:mod:`dmlctl.slurm.transport`).
The run's controller cancels the allocation when the run ends; ``dmlctl stop``
stops the ranks (they get ``stop_grace``) and then cancels it too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from rich.console import Console

from dmlctl.errors import DmlctlError, PlanError
from dmlctl.launch.options import LaunchOptions, LaunchResult
from dmlctl.launch.schedulers import DRY_RUN_NOTE, DRY_RUN_PORT, SshScheduler
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.placing import JobPlacement, as_run, place_job
from dmlctl.plan.request import Facts, LaunchRequest
from dmlctl.runs.store import RunDir, RunStore
from dmlctl.slurm import allocation, enclosing
from dmlctl.slurm.allocation import Allocation, JobState
from dmlctl.slurm.commands import SlurmError, SlurmRefused, refused_key
from dmlctl.slurm.enclosing import enclosing_job
from dmlctl.slurm.info import seconds_until
from dmlctl.slurm.record import pending
from dmlctl.slurm.transport import Node, transports_for
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.spec.slurm import SlurmSpec
from dmlctl.text import plural
from dmlctl.transport import ssh_route
from dmlctl.ui.format import format_duration

DRY_STORE_HOST = "<this machine>"
DRY_STORE_NOTE = (
    "that every node reaches this machine (the run's store; its address is checked at launch)"
)


class SlurmScheduler(SshScheduler):
    """The nodes of one Slurm allocation, reached through ``srun`` (no SSH)."""

    name = "slurm"

    def __init__(
        self,
        options: LaunchOptions,
        consoles: tuple[Console, Console],
        spec: SlurmSpec,
        plan: LaunchPlan | None = None,
    ) -> None:
        super().__init__(options, consoles, plan)
        self._spec = spec
        self._job_id: str | None = None

    def gather(self, job: JobSpec, cluster: ClusterSpec, placement: JobPlacement) -> Facts:
        from dmlctl.provision import ship

        lib = ship.lib_id(ship.package_files())
        if self._options.dry_run:
            if self._spec.allocation == "enclosing":  # refused as the launch would
                _refuse_requeue(self._spec, enclosing_job(self._spec.conf))
            return Facts(
                DRY_RUN_PORT,
                sys.executable,
                routes=_dry_routes(placement, self._spec.gpus_per_node),
                lib=lib,
                assumed=(*_dry_assumed(self._spec), DRY_STORE_NOTE),
                port_note=DRY_RUN_NOTE,
                store_host=DRY_STORE_HOST,
            )
        hosts = [h.name for h in placement.hosts]
        slots = max(h.slots for h in placement.hosts)
        name = job.name or "job"
        where, addresses = ask(self._spec, name, hosts, slots, self._err, self._submitted)
        try:
            if len(where.nodes) < len(placement.hosts):  # a range: fewer nodes granted
                placement = place_job(cluster.granted(len(where.nodes)), job)
            bound = {host: addresses[node] for host, node in where.nodes.items()}
            self._transports = transports_for(placement.hosts, where)
            placed = placement.bound(bound)
            first = as_run(placed.first, sys.executable)
            port, gpus = self._preflight(placed, first)
            store = self._store_host(placed)
        except BaseException:
            self.release()
            raise
        routes = {h: r for h, t in self._transports.items() if (r := ssh_route(t)) is not None}
        return Facts(
            port, sys.executable, first.address, gpus, lib, routes, (), None, bound, where, store
        )

    def _submitted(self, job_id: str) -> None:
        self._job_id = job_id

    def schedule(
        self, request: LaunchRequest, job: JobSpec, cluster: ClusterSpec, store: RunStore
    ) -> LaunchResult:
        try:
            return super().schedule(request, job, cluster, store)
        except BaseException:
            self._cancel()
            raise

    def release(self) -> None:
        super().release()
        self._cancel()

    def _cancel(self) -> None:
        if self._job_id is not None:
            allocation.cancel(self._job_id, self._spec.conf)

    def describe(self, run: RunDir) -> list[str]:
        """The allocation's job, its state and time left, and each node of it, marked
        when the run no longer uses it (lost, or set aside)."""
        where = self._plan.allocation if self._plan is not None else None
        if where is None:
            return ["where: unknown (the plan names no Slurm allocation)"]
        try:
            now = allocation.state(where.job_id, where.conf)
        except DmlctlError as e:
            said = f"state unknown: {e}"
        else:
            said = now.said
            limited = now.state == "RUNNING" and now.time_limit != "UNLIMITED"
            left = seconds_until(now.end_time, time.time()) if limited else None
            if left is not None:  # from the end time: one an administrator moved too
                said += f", {format_duration(left)} left (ends {now.end_time})"
        try:
            used = set(run.read_state().hosts)
        except DmlctlError:  # no state to say: every node as planned
            used = set(where.nodes)
        lines = [f"where: Slurm job {where.job_id}, {said}"]
        for host, node in where.nodes.items():
            lines.append(f"  {host}: {node}" + ("" if host in used else " (not in use)"))
        return lines

    def cancel(self, run: RunDir, *, timeout: float) -> str:
        """Stop the run (its ranks get ``stop_grace``), then cancel its allocation (not
        one dmlctl ran inside); the line says what became of the allocation."""
        said = super().cancel(run, timeout=timeout)
        plan = self._plan
        if plan is None or plan.allocation is None:
            return said
        where = plan.allocation
        try:
            ended = allocation.state(where.job_id, where.conf).ended
        except DmlctlError:
            ended = False
        name = f"dmlctl-{plan.job_name}"
        if ended:  # the run's end ended it (or Slurm did)
            said += f"; Slurm job {where.job_id} has ended"
        elif not where.owned:  # the allocation dmlctl ran inside: its owner's
            said += f"; Slurm job {where.job_id} (dmlctl ran inside it) left as it is"
        else:  # by name too: a job id Slurm has since given to another job is left
            allocation.cancel(where.job_id, where.conf, name=name)
            said += f"; Slurm job {where.job_id} cancelled"
        if (queued := pending(run.path)) is not None:  # a requeue's, not granted yet
            allocation.cancel(queued, where.conf, name=name)
            said += f"; queued Slurm job {queued} cancelled"
        return said

    def logs(self, run: RunDir) -> list[str]:
        """The rank files kept on the nodes, while the allocation holds them."""
        where = self._plan.allocation if self._plan is not None else None
        if where is not None:
            try:
                allocation.require_live(where, "the nodes' rank files cannot be read")
            except DmlctlError as e:
                return [str(e)]
        return super().logs(run)


def ask(
    spec: SlurmSpec,
    name: str,
    hosts: list[str],
    slots: int,
    err: Console,
    on_submit: Callable[[str], None] = lambda _: None,
) -> tuple[Allocation, dict[str, str]]:
    """Ask Slurm for ``spec``'s allocation for job ``name`` and wait, said on ``err``,
    until it runs (as long as it queues; Ctrl-C cancels it), each node with ``slots``
    worker slots; the allocation with its
    nodes bound to ``hosts`` in order, and each node's address. The allocation
    remembers its ``sbatch`` command for a requeue, asking for as many nodes as were
    granted. ``on_submit`` gets the job id as soon as Slurm gives it. A request Slurm
    refuses is a PlanError at the ``slurm:`` key its words name. Inside an allocation
    (``slurm.allocation: enclosing``, the default) that one is taken instead."""
    inside = enclosing_job(spec.conf) if spec.allocation == "enclosing" else None
    if inside is not None:
        return _enclosing(spec, inside, hosts, err)
    argv = allocation.request_argv(spec, name, slots)
    with err.status("asking Slurm for an allocation…") as shown:
        job_id = ""

        def submitted(given: str) -> None:
            nonlocal job_id
            job_id = given
            on_submit(given)
            shown.update(f"Slurm job {given}: waiting for its allocation…")

        def waiting(now: JobState) -> None:
            shown.update(f"Slurm job {job_id}: {now.said}…")

        try:
            got = allocation.allocate(
                argv, name, spec.conf, waiting, submitted, need=spec.min_nodes
            )
        except SlurmRefused as e:
            if not str(e).startswith(("sbatch", "salloc")):
                raise
            raise PlanError("cluster", refused_key(str(e)), str(e)) from None  # the request
    said = f"Slurm job {got.job_id}: {plural(len(got.nodes), 'node')} ({', '.join(got.nodes)})"
    err.print(said, markup=False)
    paired = dict(zip(hosts, got.nodes, strict=False))
    again = allocation.request_argv(spec.model_copy(update={"nodes": len(paired)}), name, slots)
    return _allocation(spec, got.job_id, paired, tuple(again)), got.addresses


NEW = "slurm.allocation: new asks for an allocation of its own"
REQUEST_KEYS = (
    *("partition", "account", "qos", "time", "exclusive", "cpus_per_node", "mem"),
    *("salloc", "sbatch_options"),
)
"""The ``slurm:`` keys of a request, which an enclosing allocation has settled."""


def _enclosing(
    spec: SlurmSpec, job_id: str, hosts: list[str], err: Console
) -> tuple[Allocation, dict[str, str]]:
    """The allocation dmlctl runs inside as the run's: its first nodes (as many as
    ``slurm.nodes`` asks for, fewer within a range) bound to ``hosts``; never requeued
    (dmlctl runs in it and ends with it) and never ended by dmlctl. PlanError at
    ``slurm.requeue`` when asked for, at ``slurm.nodes`` when it has too few nodes."""
    _refuse_requeue(spec, job_id)
    try:
        got = enclosing.adopt(job_id, spec.conf, spec.min_nodes)
    except enclosing.TooFewNodes as e:
        raise PlanError("cluster", ("slurm", "nodes"), f"{e} ({NEW})") from None
    except SlurmError as e:
        raise PlanError("cluster", ("slurm", "allocation"), f"{e} ({NEW})") from None
    if ignored := [k for k in REQUEST_KEYS if k in spec.model_fields_set]:
        keys = ", ".join(f"slurm.{k}" for k in ignored)
        err.print(f"{keys}: not used inside Slurm job {job_id} ({NEW})", markup=False)
    nodes = got.nodes[: spec.max_nodes]
    err.print(
        f"Slurm job {got.job_id} (dmlctl runs inside it): {plural(len(nodes), 'node')} "
        f"({', '.join(nodes)}); {NEW}",
        markup=False,
    )
    paired = dict(zip(hosts, nodes, strict=False))
    return _allocation(spec, got.job_id, paired), got.addresses


def _refuse_requeue(spec: SlurmSpec, job_id: str | None) -> None:
    """PlanError at ``slurm.requeue`` for a run inside allocation ``job_id`` (None:
    none) that asks for it."""
    if spec.requeue and job_id is not None:
        raise PlanError(
            "cluster",
            ("slurm", "requeue"),
            f"dmlctl runs inside Slurm job {job_id} and ends when that job ends, so it "
            f"cannot ask for a new allocation then ({NEW})",
        )


def _allocation(
    spec: SlurmSpec, job_id: str, nodes: dict[str, str], again: tuple[str, ...] = ()
) -> Allocation:
    """The run's allocation ``job_id`` on ``nodes`` (host → node) as ``spec`` wants it;
    ``again``: the request that asks for it anew (none: dmlctl did not ask for it, so
    it never asks again nor ends it)."""
    return Allocation(
        job_id,
        nodes,
        spec.conf,
        spec.gpus_per_node,
        spec.setup,
        again,
        spec.requeue and bool(again),
        spec.warn_before_end,
        owned=bool(again),
    )


def _dry_assumed(spec: SlurmSpec) -> tuple[str, ...]:
    """What a dry run assumes of the allocation it does not ask for."""
    said = [
        "the allocation's nodes: node-0 … are bound to them in the order Slurm lists "
        "them, and node-0 serves the rendezvous"
    ]
    if spec.allocation == "enclosing" and (inside := enclosing_job(spec.conf)) is not None:
        said.append(
            f"dmlctl runs inside Slurm job {inside}: the run takes its nodes instead of "
            f"the request below ({NEW})"
        )
    if spec.is_range:
        said.append(
            f"Slurm grants {spec.max_nodes} nodes (slurm.nodes: {spec.nodes}); with fewer, "
            f"the run is planned on those; when nodes are lost, it goes on down to "
            f"min_hosts (default: {spec.min_nodes})"
        )
    return tuple(said)


def _dry_routes(placement: JobPlacement, gpus: int) -> dict[str, str]:
    """How each host would be reached, before the allocation exists."""
    return {
        h.name: " ".join(Node("<job>", f"<node {i}>", gpus=gpus).srun(f"dmlctl-agent-{h.name}"))
        for i, h in enumerate(placement.hosts)
    }
