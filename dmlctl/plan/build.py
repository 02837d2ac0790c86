"""Pure construction of a :class:`LaunchPlan` from validated specs.

No I/O, no clock, no randomness: the run id, the rendezvous port, the controller's
interpreter and the local run directory are arguments, so the same inputs always
give the same plan (tests compare plans against fixtures).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence

from dmlctl import protocol
from dmlctl.errors import PlanError
from dmlctl.plan.model import HostPlan, LaunchPlan, RankPlan
from dmlctl.spec.fields import MAX_WORKERS
from dmlctl.spec.models import ClusterSpec, JobSpec, ResolvedHost
from dmlctl.strategies import registry

WORKER_ROLE = protocol.ROLE_WORKER
SERVER_ROLE = protocol.ROLE_SERVER


def as_run(host: ResolvedHost, local_python: str) -> ResolvedHost:
    """``host`` with the interpreter a run uses there: on ``localhost`` that is the one
    running dmlctl (``local_python``), elsewhere the host's ``python``."""
    return dataclasses.replace(host, python=local_python) if host.is_local else host


def _assign(hosts: Sequence[ResolvedHost], workers: int) -> list[tuple[ResolvedHost, int]]:
    """Fill hosts in order, each up to its slots; hosts left without a worker are dropped."""
    total = sum(h.slots for h in hosts)
    if workers > total:
        per_host = ", ".join(f"{h.name}: {h.slots}" for h in hosts[:4])
        per_host += ", ..." if len(hosts) > 4 else ""
        raise PlanError(
            "job", ("workers",),
            f"the job asks for {workers} workers but the cluster has {total} slots "
            f"({per_host}); lower 'workers' (or --workers) or raise the hosts' slots",
        )  # fmt: skip
    out: list[tuple[ResolvedHost, int]] = []
    left = workers
    for host in hosts:
        if left == 0:
            break
        n = min(host.slots, left)
        out.append((host, n))
        left -= n
    return out


def _place_servers(
    job: JobSpec,
    hosts: Sequence[ResolvedHost],
    assignment: list[tuple[ResolvedHost, int]],
) -> dict[str, int]:
    """How many parameter servers each host runs (host name → count): spread in turn
    over ``job.server_hosts`` when given, else over the hosts that got workers."""
    if job.parameter_servers == 0:
        return {}
    if job.server_hosts is not None:
        targets = [h.name for h in hosts if h.name in job.server_hosts]
    else:
        targets = [h.name for h, _ in assignment]
    counts: dict[str, int] = {}
    for i in range(job.parameter_servers):
        name = targets[i % len(targets)]
        counts[name] = counts.get(name, 0) + 1
    return counts


def _check_server_hosts(job: JobSpec, hosts: Sequence[ResolvedHost]) -> None:
    if job.parameter_servers and (job.min_hosts is not None or job.max_hosts is not None):
        raise PlanError(
            "job", ("min_hosts" if job.min_hosts is not None else "max_hosts",),
            "min_hosts/max_hosts (continuing on fewer hosts) is not supported with "
            "parameter_servers yet; remove them (a lost host then fails the run)",
        )  # fmt: skip
    if job.server_hosts is None:
        return
    names = {h.name for h in hosts}
    unknown = [i for i, n in enumerate(job.server_hosts) if n not in names]
    if unknown:
        listed = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
        raise PlanError(
            "job", ("server_hosts", unknown[0]),
            f"{job.server_hosts[unknown[0]]!r} is not a host of the cluster (hosts: {listed})",
        )  # fmt: skip
    if len(job.server_hosts) >= len(hosts):
        raise PlanError(
            "job", ("server_hosts",),
            "lists every host of the cluster; leave some for workers",
        )  # fmt: skip


def _check_strategy_hosts(job: JobSpec, n_hosts: int) -> None:
    """A strategy that runs on one host only (hogwild: ``check_hosts``) refuses more."""
    module = registry.load(job.strategy.name)
    check = getattr(module, "check_hosts", None)
    if check is None:
        return
    message = check(module.Params.model_validate(dict(job.strategy.params)), n_hosts)
    if message:
        raise PlanError("job", ("strategy",), f"strategy {job.strategy.name!r}: {message}")


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
    return env


def world_problem(strategy: str, params: Mapping[str, object], workers: int) -> str | None:
    """Why ``strategy`` with ``params`` cannot run on ``workers`` workers (EASGD's
    α ≤ 1/p: its module's ``check_world(params, world_size)``), or None."""
    module = registry.load(strategy)
    check = getattr(module, "check_world", None)
    if check is None:
        return None
    message = check(module.Params.model_validate(dict(params)), workers)
    return f"strategy {strategy!r} with {workers} workers: {message}" if message else None


def _check_strategy_world(job: JobSpec, workers: int) -> None:
    problem = world_problem(job.strategy.name, job.strategy.params, workers)
    if problem:
        raise PlanError("job", ("strategy", "params"), problem)


def torchrun_argv(
    python: str,
    *,
    nnodes: int,
    nproc: int,
    rdzv_endpoint: str,
    run_id: str,
    script: str,
    args: Sequence[str],
    is_host: bool = True,
    local_addr: str | None = None,
) -> tuple[str, ...]:
    """The exact torchrun command for one host (the real elastic agent, c10d rendezvous).

    Each worker runs ``dmlctl.runtime.entry``, which records the rank's start and
    exit and then runs ``script`` unchanged, as torchrun would. ``is_host`` tells
    torchrun whether this host serves the c10d store, instead of letting it guess
    from host names (which fails on multi-homed machines and loopback test hosts);
    ``local_addr`` (the first host of a multi-host run) becomes MASTER_ADDR, so ranks
    meet at the address the preflight checked, not at a guessed host name.
    """
    return (
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", rdzv_endpoint,
        "--rdzv-id", run_id,
        "--rdzv-conf", f"is_host={str(is_host).lower()}",
        "--max-restarts", "0",
        *(("--local-addr", local_addr) if local_addr else ()),
        "-m", "dmlctl.runtime.entry",
        script, *args,
    )  # fmt: skip


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
) -> LaunchPlan:
    """Plan ``job`` on ``cluster``.

    Promises: ranks are numbered host by host in cluster order (node rank = position
    among hosts that got workers); every host's environment holds the job env, the
    host env and the ``DMLCTL_*`` variables of :mod:`dmlctl.protocol`; the rendezvous
    endpoint is the first host at ``rdzv_port``; a remote host runs its agent from
    ``<workdir>/.dmlctl/lib/<lib_id>``, where code sync puts this dmlctl.
    ``rdzv_host`` is the first host's network name when its address is an alias
    (``~/.ssh/config`` HostName). Raises :class:`PlanError` (naming the spec key at
    fault) when the job asks for more workers than the cluster has slots (or more
    than :data:`MAX_WORKERS` processes), when the strategy refuses the world size or
    the number of hosts, for ``server_hosts`` / ``min_hosts`` that cannot be met, or
    when other hosts would have to reach ``localhost`` for the rendezvous.
    """
    hosts = tuple(as_run(h, local_python) for h in cluster.resolved_hosts())
    _check_server_hosts(job, hosts)
    server_only = set(job.server_hosts or ())
    usable = tuple(h for h in hosts if h.name not in server_only)
    usable = usable[: job.max_hosts] if job.max_hosts is not None else usable
    workers = job.workers if job.workers is not None else sum(h.slots for h in usable)
    if workers + job.parameter_servers > MAX_WORKERS:
        raise PlanError(
            "job" if job.workers is not None else "cluster",
            ("workers",) if job.workers is not None else ("hosts",),
            f"{workers} workers and {job.parameter_servers} parameter servers are more than "
            f"{MAX_WORKERS} processes; set 'workers' lower",
        )  # fmt: skip
    assignment = _assign(usable, workers)
    _check_strategy_world(job, workers)
    servers = _place_servers(job, hosts, assignment)
    assignment += [(h, 0) for h in hosts if h.name in server_only and servers.get(h.name)]
    _check_strategy_hosts(job, len(assignment))
    if job.min_hosts is not None and job.min_hosts > len(assignment):
        raise PlanError(
            "job", ("min_hosts",),
            f"is {job.min_hosts} but the job needs only {len(assignment)} host(s)"
            f" for {workers} workers; lower min_hosts or raise workers",
        )  # fmt: skip
    first = assignment[0][0]
    if first.is_local and any(not h.is_local for h, _ in assignment):
        index = next(i for i, h in enumerate(hosts) if h.name == first.name)
        raise PlanError(
            "cluster", ("hosts", index, "address"),
            f"host {first.name!r} is 'localhost', which the other hosts cannot reach for the"
            " rendezvous; list a remote host first, or give this machine's network address",
        )  # fmt: skip
    rdzv_endpoint = f"{rdzv_host or first.address}:{rdzv_port}"
    params: Mapping[str, object] = dict(job.strategy.params)

    def roles_env(host: ResolvedHost, nproc: int) -> dict[str, str]:
        if not servers:
            return {}
        roles = [WORKER_ROLE] * nproc + [SERVER_ROLE] * servers.get(host.name, 0)
        return {protocol.ENV_LOCAL_ROLES: ",".join(roles)}

    def host_plan(host: ResolvedHost, node_rank: int, nproc: int, first_rank: int) -> HostPlan:
        n_servers = servers.get(host.name, 0) if node_rank >= 0 else 0
        agent_cwd: str | None = None
        if host.is_local:
            workdir = job.workdir
            rank_dir = posixpath.join(local_run_dir, "hosts", host.name)
        else:
            workdir = posixpath.join(host.workdir, job_dir_name(job))
            rank_dir = posixpath.join(host.workdir, ".dmlctl", "runs", run_id, host.name)
            agent_cwd = lib_dir(host.workdir, lib_id)
        # torchrun's own default for several workers per host, set here so it does not
        # print its banner about it; the job or host env may override it.
        threads = {"OMP_NUM_THREADS": "1"} if nproc + n_servers > 1 else {}
        env = {
            **threads,
            **_flight_recorder(job.env, host.env),
            **job.env,
            **host.env,
            "PYTHONUNBUFFERED": "1",
            protocol.ENV_RUN_ID: run_id,
            protocol.ENV_RANK_DIR: rank_dir,
            protocol.ENV_HOST: host.name,
            protocol.ENV_ROLE: WORKER_ROLE,
            protocol.ENV_STRATEGY: job.strategy.name,
            protocol.ENV_STRATEGY_PARAMS: json.dumps(params, sort_keys=True),
            protocol.ENV_SCRIPT: job.script,
            **(roles_env(host, nproc) if node_rank >= 0 else {}),
            **_checkpoint_env(
                job, posixpath.join(posixpath.dirname(rank_dir), "checkpoints"), run_id
            ),
        }
        return HostPlan(
            name=host.name,
            address=host.address,
            is_local=host.is_local,
            port=host.port,
            user=host.user,
            identity_file=host.identity_file,
            node_rank=node_rank,
            nproc=nproc + n_servers,
            first_rank=first_rank,
            python=host.python,
            workdir=workdir,
            rank_dir=rank_dir,
            agent_argv=(host.python, "-m", "dmlctl.agent", "--run-id", run_id),
            agent_cwd=agent_cwd,
            torchrun_argv=torchrun_argv(
                host.python,
                nnodes=len(assignment),
                nproc=nproc + n_servers,
                rdzv_endpoint=rdzv_endpoint,
                run_id=run_id,
                script=job.script,
                args=job.args,
                is_host=node_rank == 0,
                local_addr=(rdzv_host or first.address)
                if node_rank == 0 and len(assignment) > 1
                else None,
            ),
            env=env,
            slots=host.slots,
        )

    host_plans: list[HostPlan] = []
    ranks: list[RankPlan] = []
    for node_rank, (host, nproc) in enumerate(assignment):
        host_plans.append(host_plan(host, node_rank, nproc, len(ranks)))
        roles = [WORKER_ROLE] * nproc + [SERVER_ROLE] * servers.get(host.name, 0)
        ranks += [RankPlan(len(ranks) + i, host.name, i, role) for i, role in enumerate(roles)]
    used = {h.name for h in host_plans}
    spares = tuple(host_plan(h, -1, 0, 0) for h in hosts if h.name not in used)
    return LaunchPlan(
        run_id=run_id,
        job_name=job.name or "job",
        strategy=job.strategy.name,
        strategy_params=params,
        script=job.script,
        args=tuple(job.args),
        world_size=len(ranks),
        restart=job.restart,
        checkpoint=job.checkpoint,
        rdzv_endpoint=rdzv_endpoint,
        hosts=tuple(host_plans),
        ranks=tuple(ranks),
        spares=spares,
        min_hosts=job.min_hosts if job.min_hosts is not None else len(host_plans),
        max_hosts=job.max_hosts if job.max_hosts is not None else len(host_plans),
        workers=workers,
        parameter_servers=job.parameter_servers,
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
