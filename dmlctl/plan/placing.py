"""Placing a job on a cluster (pure): every plan-time check, then where its ranks go
(:mod:`dmlctl.plan.placement`, the rule re-plans use too). :func:`place_job` gives
the :class:`JobPlacement` that :func:`dmlctl.plan.build.build_plan` turns into the
plan; on a Slurm ``nodes`` range it also checks the range's low end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dmlctl.errors import PlanError
from dmlctl.mesh import MeshLayout
from dmlctl.plan.checks import gpus_problem, hosts_problem, world_problem
from dmlctl.plan.placement import Demand, HostSlots, Placed, place
from dmlctl.spec.fields import MAX_WORKERS
from dmlctl.spec.messages import format_path
from dmlctl.spec.models import ClusterSpec, JobSpec, ResolvedHost
from dmlctl.spec.parallelism import MeshMismatch
from dmlctl.text import plural


def as_run(host: ResolvedHost, local_python: str) -> ResolvedHost:
    """``host`` with the interpreter a run uses there: on ``localhost`` that is the one
    running dmlctl (``local_python``), elsewhere the host's ``python``."""
    return dataclasses.replace(host, python=local_python) if host.is_local else host


@dataclass(frozen=True)
class JobPlacement:
    """Where a job's ranks go on a cluster, every plan-time check passed."""

    hosts: tuple[ResolvedHost, ...]  # the cluster's hosts, in cluster order
    placed: tuple[Placed, ...]  # node order
    workers: int
    mesh: MeshLayout | None = None  # the job's parallelism: block, resolved for workers

    @property
    def first(self) -> ResolvedHost:
        """Node 0: the host that serves the rendezvous."""
        return next(h for h in self.hosts if h.name == self.placed[0].host)

    def bound(self, addresses: Mapping[str, str]) -> JobPlacement:
        """This placement with the hosts named in ``addresses`` at those addresses (a
        batch scheduler's nodes, known once its allocation starts)."""
        hosts = tuple(
            dataclasses.replace(h, address=addresses[h.name]) if h.name in addresses else h
            for h in self.hosts
        )
        return dataclasses.replace(self, hosts=hosts)


def _check_fixed_hosts(job: JobSpec) -> None:
    """No ``min_hosts``/``max_hosts`` (a re-plan on other hosts) with a device mesh."""
    if (job.min_hosts is None and job.max_hosts is None) or job.parallelism is None:
        return
    raise PlanError(
        "job",
        ("min_hosts" if job.min_hosts is not None else "max_hosts",),
        "min_hosts/max_hosts (continuing on fewer hosts) is not supported with parallelism "
        "(a re-plan on fewer hosts would break the device mesh); remove them (a lost host "
        "then fails the run)",
    )


def _check_server_hosts(job: JobSpec, hosts: Sequence[ResolvedHost]) -> None:
    """``server_hosts`` names hosts of the cluster and leaves some for workers."""
    if job.server_hosts is None:
        return
    names = {h.name for h in hosts}
    unknown = [i for i, n in enumerate(job.server_hosts) if n not in names]
    if unknown:
        listed = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
        raise PlanError(
            "job",
            ("server_hosts", unknown[0]),
            f"{job.server_hosts[unknown[0]]!r} is not a host of the cluster (hosts: {listed})",
        )
    if len(job.server_hosts) >= len(hosts):
        raise PlanError(
            "job",
            ("server_hosts",),
            "lists every host of the cluster; leave some for workers",
        )


def _demand(job: JobSpec, hosts: Sequence[ResolvedHost]) -> Demand:
    """What the job asks of ``hosts``; refused when it does not fit. Without
    ``workers`` the job takes every slot of the hosts that may run workers."""
    server_only = tuple(job.server_hosts or ())
    usable = [h for h in hosts if h.name not in server_only][: job.max_hosts]
    workers = job.workers if job.workers is not None else sum(h.slots for h in usable)
    if workers + job.parameter_servers > MAX_WORKERS:
        raise PlanError(
            "job" if job.workers is not None else "cluster",
            ("workers",) if job.workers is not None else ("hosts",),
            f"{workers} workers and {job.parameter_servers} parameter servers are more than "
            f"{MAX_WORKERS} processes; set 'workers' lower",
        )
    total = sum(h.slots for h in usable)
    if workers > total:
        per_host = ", ".join(f"{h.name}: {h.slots}" for h in usable[:4])
        per_host += ", ..." if len(usable) > 4 else ""
        raise PlanError(
            "job",
            ("workers",),
            f"the job asks for {plural(workers, 'worker')} but the cluster has "
            f"{plural(total, 'slot')} "
            f"({per_host}); lower 'workers' (or --workers) or raise the hosts' slots",
        )
    return Demand(workers, job.parameter_servers, server_only, job.max_hosts)


def _check_hosts(job: JobSpec, placed: Sequence[Placed], hosts: Sequence[ResolvedHost]) -> None:
    """The strategy's host count, ``min_hosts``, and a rendezvous others can reach."""
    problem = hosts_problem(job.strategy.name, job.strategy.params, len(placed))
    if problem:
        raise PlanError("job", ("strategy",), problem)
    if job.min_hosts is not None and job.min_hosts > len(placed):
        workers = sum(p.workers for p in placed)
        raise PlanError(
            "job",
            ("min_hosts",),
            f"is {job.min_hosts} but the job needs only {plural(len(placed), 'host')}"
            f" for {plural(workers, 'worker')}; lower min_hosts or raise workers",
        )
    by_name = {h.name: (i, h) for i, h in enumerate(hosts)}
    index, first = by_name[placed[0].host]
    if first.is_local and any(not by_name[p.host][1].is_local for p in placed):
        raise PlanError(
            "cluster",
            ("hosts", index, "address"),
            f"host {first.name!r} is 'localhost', which the other hosts cannot reach for the"
            " rendezvous; list a remote host first, or give this machine's network address",
        )


def _mesh(job: JobSpec, workers: int) -> MeshLayout | None:
    """The job's device mesh on ``workers`` workers (None without ``parallelism:``);
    :class:`PlanError` at the degree most at fault when the degrees do not fit."""
    if job.parallelism is None:
        return None
    try:
        return job.parallelism.layout(workers)
    except MeshMismatch as e:
        auto = " (workers: auto: every slot of the cluster)" if job.workers is None else ""
        raise PlanError("job", ("parallelism", e.key), f"{e}{auto}", ("workers",)) from None


def place_job(
    cluster: ClusterSpec, job: JobSpec, gpus: Mapping[str, int] | None = None
) -> JobPlacement:
    """Place ``job`` on ``cluster``: every plan-time check, nothing else. ``gpus``:
    the GPU count of each host whose count is known (see :func:`check_gpus`).

    Raises :class:`PlanError` (naming the spec key at fault) when the job asks for
    more workers than the cluster has slots (or more than :data:`MAX_WORKERS`
    processes), when the degrees of its ``parallelism:`` block do not fit its workers
    (``--workers`` and ``workers: auto`` included), when the strategy refuses the
    world size or the number of hosts, for ``server_hosts`` / ``min_hosts`` that
    cannot be met, or when other hosts would have to reach ``localhost`` for the
    rendezvous. On a Slurm ``nodes`` range: at ``slurm.nodes`` when the job cannot run
    on the range's low end, or has parameter servers or ``parallelism:``; on fewer
    nodes than the range's most (an allocation granted), ``workers`` is at most
    their slots.
    """
    hosts = tuple(cluster.resolved_hosts())
    _check_fixed_hosts(job)
    _check_server_hosts(job, hosts)
    slurm = cluster.slurm_spec
    if slurm is not None and slurm.is_range and len(hosts) < slurm.max_nodes:
        job = _fewer_workers(job, hosts)  # granted fewer nodes than the range's most
    placement = _place_on(hosts, job, gpus or {})
    if slurm is not None and slurm.is_range and slurm.min_nodes < len(hosts):
        _check_fewest(job, hosts[: slurm.min_nodes], slurm.nodes)
    return placement


def _fewer_workers(job: JobSpec, hosts: Sequence[ResolvedHost]) -> JobSpec:
    """``job`` on fewer Slurm nodes than its range's most: at most as many workers as
    ``hosts`` have slots (``workers`` is then an upper bound, as after a lost host)."""
    total = sum(h.slots for h in hosts)
    if job.workers is not None and job.workers > total:
        return job.model_copy(update={"workers": total})
    return job


def _place_on(
    hosts: tuple[ResolvedHost, ...], job: JobSpec, gpus: Mapping[str, int]
) -> JobPlacement:
    """The placement of ``job`` on ``hosts``, with the checks that depend on them."""
    demand = _demand(job, hosts)
    mesh = _mesh(job, demand.workers)
    problem = world_problem(job.strategy.name, job.strategy.params, demand.workers)
    if problem:
        raise PlanError("job", ("strategy", "params"), problem)
    placed = place([HostSlots(h.name, h.slots) for h in hosts], demand)
    _check_hosts(job, placed, hosts)
    check_gpus(job, placed, gpus)
    return JobPlacement(hosts, placed, demand.workers, mesh)


def _check_fewest(job: JobSpec, fewest: tuple[ResolvedHost, ...], nodes: int | str) -> None:
    """A Slurm ``nodes`` range: the job must run on its low end too (Slurm may grant
    no more), and only where a run may change its number of hosts."""
    at = ("slurm", "nodes")
    if job.parameter_servers or job.parallelism is not None:
        what = "parameter_servers" if job.parameter_servers else "parallelism"
        raise PlanError(
            "cluster", at, f"a range ({nodes}) is not supported with {what}: give a node count"
        )
    try:
        _place_on(fewest, _fewer_workers(job, fewest), {})
    except PlanError as e:
        raise PlanError(
            "cluster",
            at,
            f"Slurm may grant {plural(len(fewest), 'node')} of {nodes}, where the job "
            f"cannot run ({format_path(e.path)} {e.message}); raise the range's low end",
            e.involves,
        ) from None


def check_gpus(job: JobSpec, placed: Sequence[Placed], gpus: Mapping[str, int]) -> None:
    """Raise :class:`PlanError` (at ``workers``, or ``backend`` when the job set one)
    when a host of ``gpus`` (host → GPU count) would run more workers than it has GPUs
    under an NCCL backend."""
    problem = gpus_problem(job.strategy.name, job.backend, placed, gpus)
    if problem:
        key = "backend" if "backend" in job.model_fields_set else "workers"
        raise PlanError("job", (key,), problem)
