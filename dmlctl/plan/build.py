"""Pure construction of a :class:`LaunchPlan` from validated specs.

No I/O, no clock, no randomness: the run id, the rendezvous port, the controller's
interpreter and the local run directory are arguments, so the same inputs always
give the same plan (tests compare plans against fixtures). :func:`place_job` makes
every plan-time check and places the ranks (:mod:`dmlctl.plan.placement`, the rule
re-plans use too); :func:`build_plan` turns that placement into the plan.
"""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dmlctl import gpus as gpu_rules
from dmlctl import protocol
from dmlctl.agent_config import TorchrunCommand
from dmlctl.errors import PlanError
from dmlctl.mesh import MeshLayout, dumps
from dmlctl.plan.checks import gpus_problem, hosts_problem, world_problem
from dmlctl.plan.layout import lay_out
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.plan.placement import Demand, HostSlots, Placed, place
from dmlctl.spec.fields import MAX_WORKERS
from dmlctl.spec.messages import format_path
from dmlctl.spec.models import ClusterSpec, JobSpec, ResolvedHost
from dmlctl.spec.parallelism import MeshMismatch
from dmlctl.text import plural

WORKER_ROLE = protocol.ROLE_WORKER
SERVER_ROLE = protocol.ROLE_SERVER


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
    """No ``min_hosts``/``max_hosts`` (a re-plan on other hosts) with parameter servers
    or a device mesh."""
    if job.min_hosts is None and job.max_hosts is None:
        return
    if job.parameter_servers:
        reason = "parameter_servers yet"
    elif job.parallelism is not None:
        reason = "parallelism (a re-plan on fewer hosts would break the device mesh)"
    else:
        return
    raise PlanError(
        "job",
        ("min_hosts" if job.min_hosts is not None else "max_hosts",),
        f"min_hosts/max_hosts (continuing on fewer hosts) is not supported with {reason}; "
        "remove them (a lost host then fails the run)",
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


def _flight_recorder(*envs: Mapping[str, str]) -> dict[str, str]:
    """PyTorch's flight recorder on (its record of every rank's collectives is how a
    hang's culprit is found), unless the job or host environment sizes it already."""
    if any(name in env for env in envs for name in protocol.FR_ENV):
        return {}
    return {protocol.FR_ENV[0]: protocol.FR_DEFAULT_SIZE}


def _checkpoint_env(job: JobSpec, directory: str, run_id: str) -> dict[str, str]:
    """The ``DMLCTL_CHECKPOINT_*`` variables for a job with a ``checkpoint:`` block;
    ``directory`` is next to the host's rank directories (the same for every attempt)
    unless the job names its own ``checkpoint.dir`` (``{run_id}`` in it is replaced
    by the run id)."""
    spec = job.checkpoint
    if spec is None:
        return {}
    if spec.dir is not None:
        directory = spec.dir.replace("{run_id}", run_id)
    env = {protocol.ENV_CHECKPOINT_DIR: directory, protocol.ENV_CHECKPOINT_KEEP: str(spec.keep)}
    if spec.every_steps is not None:
        env[protocol.ENV_CHECKPOINT_EVERY_STEPS] = str(spec.every_steps)
    if spec.every_seconds is not None:
        env[protocol.ENV_CHECKPOINT_EVERY_SECONDS] = repr(spec.every_seconds)
    if spec.allow_fresh_start:
        env[protocol.ENV_CHECKPOINT_ALLOW_FRESH] = "1"
    if spec.warm_start:
        env[protocol.ENV_CHECKPOINT_WARM_START] = "1"
    return env


@dataclass(frozen=True)
class _Where:
    """Where a run lives: its id, the local run directory, the shipped dmlctl's id and
    the rendezvous endpoint."""

    run_id: str
    local_run_dir: str
    lib_id: str
    endpoint: str


def _parallel_env(job: JobSpec, mesh: MeshLayout | None) -> dict[str, str]:
    """``DMLCTL_PARALLELISM`` (the resolved mesh) and ``DMLCTL_PARALLELIZE`` (the
    job's ``parallelize`` as written), each only when the job has it."""
    env = {protocol.ENV_PARALLELISM: dumps(mesh)} if mesh is not None else {}
    if job.parallelize is not None:
        env[protocol.ENV_PARALLELIZE] = job.parallelize
    return env


def _host_env(
    host: ResolvedHost, job: JobSpec, run_id: str, rank_dir: str, mesh: MeshLayout | None
) -> dict[str, str]:
    """A host's environment, placement aside: the job's, the host's (over the job's)
    and dmlctl's own variables."""
    checkpoints = posixpath.join(posixpath.dirname(rank_dir), "checkpoints")
    return {
        **_flight_recorder(job.env, host.env),
        **job.env,
        **host.env,
        "PYTHONUNBUFFERED": "1",
        protocol.ENV_RUN_ID: run_id,
        protocol.ENV_RANK_DIR: rank_dir,
        protocol.ENV_HOST: host.name,
        protocol.ENV_ROLE: WORKER_ROLE,
        protocol.ENV_SCRIPT: job.script,
        **({protocol.ENV_BACKEND: job.backend} if job.backend != gpu_rules.AUTO else {}),
        **_checkpoint_env(job, checkpoints, run_id),
        **_parallel_env(job, mesh),
    }


def _pool_host(
    host: ResolvedHost, job: JobSpec, where: _Where, mesh: MeshLayout | None
) -> HostPlan:
    """``host`` as a spare of the run: everything of its plan but the placement."""
    agent_cwd: str | None = None
    if host.is_local:
        workdir = job.workdir
        rank_dir = posixpath.join(where.local_run_dir, "hosts", host.name)
    else:
        workdir = posixpath.join(host.workdir, job_dir_name(job))
        rank_dir = posixpath.join(host.workdir, ".dmlctl", "runs", where.run_id, host.name)
        agent_cwd = lib_dir(host.workdir, where.lib_id)
    torchrun = TorchrunCommand(
        host.python,
        nnodes=0,
        nproc=0,
        rdzv_endpoint=where.endpoint,
        rdzv_id=where.run_id,
        script=job.script,
        args=tuple(job.args),
        is_host=False,
    )
    return HostPlan(
        name=host.name,
        address=host.address,
        is_local=host.is_local,
        port=host.port,
        user=host.user,
        identity_file=host.identity_file,
        node_rank=-1,
        nproc=0,
        first_rank=0,
        python=host.python,
        workdir=workdir,
        rank_dir=rank_dir,
        agent_argv=(host.python, "-m", "dmlctl.agent", "--run-id", where.run_id),
        agent_cwd=agent_cwd,
        torchrun=torchrun,
        env=_host_env(host, job, where.run_id, rank_dir, mesh),
        slots=host.slots,
    )


def _fewest_hosts(cluster: ClusterSpec, hosts: Sequence[HostPlan]) -> int:
    """A run's default ``min_hosts``: all of its hosts, or a Slurm range's low end."""
    slurm = cluster.slurm_spec
    return min(slurm.min_nodes, len(hosts)) if slurm is not None else len(hosts)


def build_plan(
    cluster: ClusterSpec,
    job: JobSpec,
    *,
    run_id: str,
    rdzv_port: int,
    local_python: str,
    local_run_dir: str,
    lib_id: str = "dev",
    rdzv_host: str | None = None,
    placement: JobPlacement | None = None,
) -> LaunchPlan:
    """Plan ``job`` on ``cluster`` (placed by ``placement``, default
    :func:`place_job`, which raises :class:`PlanError`).

    Promises: ranks are numbered host by host (node rank = position among the placed
    hosts); every host's environment holds the job env, the host env and the
    ``DMLCTL_*`` variables of :mod:`dmlctl.protocol` (the strategy parameters travel
    once, in the plan, and reach the ranks through their agent; a job with
    ``parallelism:`` adds its resolved mesh, ``DMLCTL_PARALLELISM``, and its
    ``parallelize``, ``DMLCTL_PARALLELIZE``); the rendezvous
    endpoint is the first host at ``rdzv_port``; a remote host runs its agent from
    ``<workdir>/.dmlctl/lib/<lib_id>``, where code sync puts this dmlctl.
    ``rdzv_host`` is the first host's network name when its address is an alias
    (``~/.ssh/config`` HostName). The cluster's other hosts are the spares.
    """
    placement = placement or place_job(cluster, job)
    endpoint = f"{rdzv_host or placement.first.address}:{rdzv_port}"
    where = _Where(run_id, local_run_dir, lib_id, endpoint)
    pool = [
        _pool_host(as_run(h, local_python), job, where, placement.mesh) for h in placement.hosts
    ]
    servers = job.parameter_servers
    hosts, ranks, spares = lay_out(
        pool, placement.placed, endpoint=endpoint, with_roles=servers > 0
    )
    return LaunchPlan(
        run_id=run_id,
        job_name=job.name or "job",
        strategy=job.strategy.name,
        strategy_params=job.strategy.params,
        script=job.script,
        args=tuple(job.args),
        world_size=len(ranks),
        restart=job.restart,
        checkpoint=job.checkpoint,
        rdzv_endpoint=endpoint,
        hosts=hosts,
        ranks=ranks,
        spares=spares,
        min_hosts=job.min_hosts if job.min_hosts is not None else _fewest_hosts(cluster, hosts),
        max_hosts=job.max_hosts if job.max_hosts is not None else len(hosts),
        workers=placement.workers,
        parameter_servers=servers,
        server_hosts=tuple(job.server_hosts or ()),
        mesh=placement.mesh,
        parallelize=job.parallelize,
    )


def lib_dir(host_workdir: str, lib_id: str) -> str:
    """Where a remote host keeps the dmlctl package shipped by code sync."""
    return posixpath.join(host_workdir, ".dmlctl", "lib", lib_id)


def job_dir_name(job: JobSpec) -> str:
    """Name of the job's code directory under a remote host's work directory."""
    return posixpath.basename(job.workdir.rstrip("/")) or "job"


def render_command(argv: Sequence[str]) -> str:
    """A shell-quoted command line, for display."""
    return shlex.join(argv)
