"""Human-readable form of a launch plan (``dmlctl launch --dry-run``), secrets redacted
(see :mod:`dmlctl.redact`: by variable name and by value, wherever they appear)."""

from __future__ import annotations

from collections.abc import Mapping

from dmlctl.mesh import describe_over, worker_ranks
from dmlctl.plan.build import SERVER_ROLE, render_command
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.redact import REDACTED, Redactor, redact_args, redact_env
from dmlctl.text import plural

__all__ = ["REDACTED", "redact_env", "render_plan"]


def _server_ranks(plan: LaunchPlan, host: str) -> str:
    ranks = [r.rank for r in plan.ranks if r.host == host and r.role == SERVER_ROLE]
    return f" (parameter servers: {', '.join(map(str, ranks))})" if ranks else ""


def _value(value: object) -> str:
    """A parameter's value as the job file would spell it (``50`` for ``50.0``)."""
    return f"{value:g}" if isinstance(value, float) else repr(value)


def _mesh_lines(plan: LaunchPlan) -> list[str]:
    """The device mesh with the global ranks of each group (mesh worker ``i`` is the
    ``i``-th worker by global rank) and ``parallelize: FILE:FUNCTION``; none without."""
    out: list[str] = []
    if plan.mesh is not None:
        workers = worker_ranks((r.rank, r.role) for r in plan.ranks)
        out += describe_over(plan.mesh, workers)
    if plan.parallelize is not None:
        out.append(f"parallelize: {plan.parallelize}")
    return out


def render_plan(
    plan: LaunchPlan, routes: Mapping[str, str] | None = None, rdzv_note: str | None = None
) -> str:
    """The strategy parameters and device mesh, then every host's agent command,
    torchrun command, directory, ranks and environment;
    secret values hidden everywhere (as ``***``). ``routes``: how each SSH host
    is reached (``user@hostname:port via JUMP``); ``rdzv_note`` follows the rendezvous."""
    servers = (
        f" + {plural(plan.parameter_servers, 'parameter server')}" if plan.parameter_servers else ""
    )
    out = [
        f"run {plan.run_id}: job {plan.job_name!r}, strategy {plan.strategy}, "
        f"{plural(plan.world_size - plan.parameter_servers, 'worker')}{servers} "
        f"on {plural(len(plan.hosts), 'host')}",
        _rendezvous_line(plan, rdzv_note),
    ]
    if given := plan.params_data():
        params = ", ".join(f"{k}={_value(v)}" for k, v in sorted(given.items()))
        out.append(f"strategy params: {params}")
    out += _mesh_lines(plan)
    for host in plan.hosts:
        first = plan.agent_config(host, store=_store(plan))  # as its first attempt runs
        last = host.first_rank + host.nproc - 1
        route = (routes or {}).get(host.name)
        where = _where(host, route)
        out += [
            "",
            f"host {host.name} — {where}, node rank {host.node_rank}, "
            f"ranks {host.first_rank}-{last}{_server_ranks(plan, host.name)}",
            f"  workdir:  {host.workdir}",
            f"  rank dir: {host.rank_dir}",
            f"  agent:    {render_command(host.agent_argv)}"
            + (f"  (in {host.agent_cwd})" if host.agent_cwd else ""),
            f"  torchrun: {render_command(redact_args(first.torchrun.argv()))}",
            "  env:",
        ]
        env = {**first.env, **plan.strategy_choice().env()}  # what every rank gets
        out += [f"    {k}={v}" for k, v in sorted(redact_env(env).items())]
    # A secret value may also stand in arguments, paths or another variable.
    return Redactor(plan.hidden_values()).text("\n".join(out))


STORE_PORT_NOTE = "port 0: the controller's store listens on a free port as each attempt starts"


def _rendezvous_line(plan: LaunchPlan, rdzv_note: str | None) -> str:
    """Where the torchruns meet: the controller's store (:attr:`LaunchPlan.store_host`),
    else (no address of this machine reaches every host) ``plan.rdzv_endpoint``."""
    if plan.store_host is not None:
        in_place = (
            ", so rank 0's host is replaced in place too" if plan.restart.mode == "in_place" else ""
        )
        return (
            f"rendezvous: c10d at {_store(plan)}, the run's store, held by this controller "
            f"({STORE_PORT_NOTE}; no host serves it{in_place})"
        )
    return f"rendezvous: c10d at {plan.rdzv_endpoint}" + (f" ({rdzv_note})" if rdzv_note else "")


def _store(plan: LaunchPlan) -> str | None:
    return f"{plan.store_host}:0" if plan.store_host is not None else None


def _where(host: HostPlan, route: str | None) -> str:
    """How ``host`` is reached, in words: this machine, a Slurm node through ``srun``,
    or over SSH (``as`` the route ~/.ssh/config resolves, where known)."""
    if host.is_local:
        return "this machine (no SSH)"
    if route is not None and route.startswith("srun "):
        return f"{host.address} through {route}"
    return f"{host.address} over SSH" + (f" as {route}" if route else "")
