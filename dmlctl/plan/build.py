"""Pure construction of a :class:`LaunchPlan` from validated specs.

No I/O, no clock, no randomness: the run id, the rendezvous port, the controller's
interpreter and the local run directory are arguments, so the same inputs always
give the same plan (tests compare plans against fixtures).
:func:`dmlctl.plan.placing.place_job` makes every plan-time check and places the
ranks; :func:`build_plan` turns that placement into the plan.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dmlctl import gpus as gpu_rules
from dmlctl import protocol
from dmlctl.agent_config import WARM_FLAG, TorchrunCommand
from dmlctl.mesh import MeshLayout, dumps
from dmlctl.plan.layout import lay_out
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.plan.placing import JobPlacement, as_run, place_job
from dmlctl.redact import args_secrets, command_secrets
from dmlctl.spec.models import ClusterSpec, JobSpec, ResolvedHost

WORKER_ROLE = protocol.ROLE_WORKER
SERVER_ROLE = protocol.ROLE_SERVER


def _flight_recorder(*envs: Mapping[str, str]) -> dict[str, str]:
    """PyTorch's flight recorder on (its record of every rank's collectives is how a
    hang's culprit is found), unless the job or host environment sizes it already."""
    if any(name in env for env in envs for name in protocol.FR_ENV):
        return {}
    return {protocol.FR_ENV[0]: protocol.FR_DEFAULT_SIZE}


def known_secrets(job: JobSpec) -> tuple[str, ...]:
    """The values of ``job`` to hide besides its secret env values: those it lists
    (``secrets:``), and the secret ones in its args and its setup."""
    found = [*job.secrets, *args_secrets(job.args), *command_secrets(job.setup or "")]
    return tuple(dict.fromkeys(found))


def _checkpoint_env(job: JobSpec, directory: str, run_id: str) -> dict[str, str]:
    """The ``DMLCTL_CHECKPOINT_*`` variables for a job with a ``checkpoint:`` block;
    ``directory`` is next to the host's rank directories (the same for every attempt)
    unless the job names its own ``checkpoint.dir`` (``{run_id}`` in it is replaced
    by the run id)."""
    spec = job.checkpoint
    if spec is None:
        return {}
    env = {protocol.ENV_CHECKPOINT_DIR: directory, protocol.ENV_CHECKPOINT_KEEP: str(spec.keep)}
    if spec.dir is not None:  # the job's own: claimed by the run (dmlctl.checkpoint_claim)
        env[protocol.ENV_CHECKPOINT_DIR] = spec.dir.replace("{run_id}", run_id)
        env[protocol.ENV_CHECKPOINT_CLAIM] = "1"
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
    spares: bool = False  # the cluster has hosts the placement left free


def _parallel_env(job: JobSpec, mesh: MeshLayout | None) -> dict[str, str]:
    """``DMLCTL_PARALLELISM`` (the resolved mesh) and ``DMLCTL_PARALLELIZE`` (the
    job's ``parallelize`` as written), each only when the job has it."""
    env = {protocol.ENV_PARALLELISM: dumps(mesh)} if mesh is not None else {}
    if job.parallelize is not None:
        env[protocol.ENV_PARALLELIZE] = job.parallelize
    return env


def _host_env(
    host: ResolvedHost, job: JobSpec, where: _Where, rank_dir: str, mesh: MeshLayout | None
) -> dict[str, str]:
    """A host's environment, placement aside: the job's, the host's (over the job's)
    and dmlctl's own variables."""
    checkpoints = posixpath.join(posixpath.dirname(rank_dir), "checkpoints")
    return {
        **_flight_recorder(job.env, host.env),
        **job.env,
        **host.env,
        "PYTHONUNBUFFERED": "1",
        protocol.ENV_RUN_ID: where.run_id,
        protocol.ENV_RANK_DIR: rank_dir,
        protocol.ENV_HOST: host.name,
        protocol.ENV_ROLE: WORKER_ROLE,
        protocol.ENV_SCRIPT: job.script,
        protocol.ENV_RANK_START: job.ranks.start,
        **({protocol.ENV_BACKEND: job.backend} if job.backend != gpu_rules.AUTO else {}),
        **_checkpoint_env(job, checkpoints, where.run_id),
        **_parallel_env(job, mesh),
        **_restart_env(job, where.spares),
    }


def _restart_env(job: JobSpec, spares: bool) -> dict[str, str]:
    """``DMLCTL_RESTART_MODE``, ``DMLCTL_RESPAWNS`` and ``DMLCTL_REJOIN_WAIT`` with
    ``restart.mode: in_place``;
    ``DMLCTL_RESPAWN_SERVERS`` and ``DMLCTL_PS_SNAPSHOT_EVERY`` too for a job with
    parameter servers (replaced in place from their snapshots), and with ``spares``
    (a server's host may be replaced by another) ``DMLCTL_PS_SNAPSHOT_COPY``."""
    if job.restart.mode != protocol.IN_PLACE:
        return {}
    restarts = str(job.restart.max_infra_restarts)
    env = {protocol.ENV_RESTART_MODE: protocol.IN_PLACE, protocol.ENV_RESPAWNS: restarts}
    env[protocol.ENV_REJOIN_WAIT] = f"{job.restart.rejoin_wait:g}"
    if job.parameter_servers > 0:
        env[protocol.ENV_RESPAWN_SERVERS] = "1"
        env[protocol.ENV_PS_SNAPSHOT_EVERY] = str(job.restart.ps_snapshot_every)
        if spares:
            env[protocol.ENV_PS_SNAPSHOT_COPY] = "1"
    return env


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
        run_name=where.run_id,
        max_restarts=job.restart.max_user_restarts + job.restart.max_infra_restarts,
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
        agent_argv=(
            host.python,
            "-m",
            "dmlctl.agent",
            "--run-id",
            where.run_id,
            *((WARM_FLAG,) if job.ranks.start == protocol.RANK_START_WARM else ()),
        ),
        agent_cwd=agent_cwd,
        torchrun=torchrun,
        env=_host_env(host, job, where, rank_dir, mesh),
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
    free = len(placement.hosts) > len(placement.placed)  # spares: hosts that run nothing
    where = _Where(run_id, local_run_dir, lib_id, endpoint, free)
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
        secrets=known_secrets(job),
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
