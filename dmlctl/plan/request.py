"""The request a launch carries out, made by one pure function from the job, the
cluster, the placement and the facts its scheduler gathered (:func:`make_request`).

``dmlctl launch --dry-run`` prints the request (:func:`render_request`) and a launch
hands the same request to its scheduler (:mod:`dmlctl.launch.schedulers`), which
carries out exactly it: so the dry run shows what a launch does, except for what the
dry run could only assume without connecting (``Facts.assumed`` says which).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from dmlctl.errors import PlanError
from dmlctl.plan.build import build_plan, render_command
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.placing import JobPlacement, check_gpus, place_job
from dmlctl.plan.render import render_plan
from dmlctl.redact import Redactor
from dmlctl.slurm.allocation import Allocation, request_lines
from dmlctl.spec.cluster import public_address
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.text import plural


@dataclass(frozen=True)
class Facts:
    """What a plan needs from the hosts, gathered once by the scheduler.

    ``port``: the rendezvous port, free on the first placed host (0: the one torchrun
    of a single-host run binds a free port itself as it starts); ``rdzv_host``: that
    host's network name (None: the local default); ``gpus``: each probed host's GPU
    count as PyTorch there sees it; ``lib``: the id of the dmlctl code the hosts run
    (``dev`` on this machine); ``routes``: how each SSH host is reached;
    ``port_note``: what the plan says of the port; ``assumed``: what a dry run
    assumed instead of asking (none at launch); ``addresses``: where hosts turned
    out to be (a batch scheduler's nodes) and ``allocation``: the Slurm allocation
    they are in; ``store_host``: where the controller holds the run's store, an
    address of this machine every host reached (a run that replaces lost hosts in
    place; None: on rank 0's host, as torchrun does)."""

    port: int
    local_python: str
    rdzv_host: str | None = None
    gpus: Mapping[str, int] = field(default_factory=dict)
    lib: str = "dev"
    routes: Mapping[str, str] = field(default_factory=dict)
    assumed: tuple[str, ...] = ()
    port_note: str | None = None
    addresses: Mapping[str, str] = field(default_factory=dict)
    allocation: Allocation | None = None
    store_host: str | None = None


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a scheduler does for one launch: the plan it starts, the hosts whose
    slots came from their GPU counts (``sized``), and the steps before the start
    (``allocate``: a Slurm allocation asked for, or the one the hosts are in; ``ship``:
    the job directory and dmlctl synced to the remote hosts, then the job's ``setup``
    run there)."""

    plan: LaunchPlan
    facts: Facts
    sized: Mapping[str, int]
    ship: tuple[str, ...]
    setup: str | None
    allocate: tuple[str, ...] = ()


def sized_slots(cluster: ClusterSpec, facts: Facts) -> dict[str, int]:
    """The hosts whose ``slots`` the cluster file leaves unset and that have more than
    one GPU, with their GPU count (their slots in the request)."""
    return {n: facts.gpus[n] for n in cluster.unset_slots() if facts.gpus.get(n, 0) > 1}


def _check_private(cluster: ClusterSpec, facts: Facts) -> None:
    """Refuse (exit 2) a rendezvous or store address the hosts' names resolved to that
    is public, unless the cluster allows it (``network.allow_public``); a literal
    public address in the cluster file was refused when it was read."""
    if cluster.network.allow_public:
        return
    for what, address in (("rendezvous", facts.rdzv_host), ("store", facts.store_host)):
        if address is not None and public_address(address):
            raise PlanError(
                "cluster",
                ("hosts", 0, "address"),
                f"the run's {what} address {address} is a public one: its listener would "
                "be reachable from anywhere; reach the hosts by their private addresses, or "
                "set network.allow_public: true in the cluster file",
            )


def make_request(
    job: JobSpec,
    cluster: ClusterSpec,
    placement: JobPlacement,
    facts: Facts,
    *,
    run_id: str,
    run_dir: str,
) -> LaunchRequest:
    """The request for run ``run_id`` (recorded under ``run_dir`` on this machine):
    pure. A host whose ``slots`` the cluster file leaves unset and that has more than
    one GPU gets its GPU count as slots (one worker per GPU); more NCCL workers than a
    host's GPUs raise :class:`~dmlctl.errors.PlanError`, like every placing refusal.
    A Slurm allocation with fewer nodes than the cluster names (``slurm.nodes`` a
    range) is planned on the nodes it has."""
    if facts.allocation is not None and len(facts.allocation.nodes) < len(cluster.hosts):
        cluster = cluster.granted(len(facts.allocation.nodes))  # a range: fewer granted
        placement = place_job(cluster, job)
    sized = sized_slots(cluster, facts)
    if sized:
        placement = place_job(cluster.with_slots(sized), job)
    check_gpus(job, placement.placed, facts.gpus)
    _check_private(cluster, facts)
    placement = placement.bound(facts.addresses)
    plan = build_plan(
        cluster,
        job,
        run_id=run_id,
        rdzv_port=facts.port,
        local_python=facts.local_python,
        local_run_dir=run_dir,
        lib_id=facts.lib,
        rdzv_host=facts.rdzv_host,
        placement=placement,
    )
    if facts.allocation is not None:
        plan = dataclasses.replace(plan, allocation=facts.allocation)
    if facts.store_host is not None:  # None: no address of this machine reaches every host
        plan = dataclasses.replace(plan, store_host=facts.store_host)
    remote = tuple(h.name for h in (*plan.hosts, *plan.spares) if not h.is_local)
    slurm = cluster.slurm_spec
    slots = max(h.slots for h in cluster.resolved_hosts())
    allocate = request_lines(slurm, plan.job_name, facts.allocation, slots) if slurm else []
    return LaunchRequest(plan, facts, sized, remote, job.setup if remote else None, tuple(allocate))


def render_request(request: LaunchRequest) -> str:
    """The request as ``--dry-run`` prints it: the plan (every host's agent and
    torchrun command, directories, ranks, environment; secrets hidden), then what
    the launch does before it starts the agents, and what the dry run assumed."""
    facts = request.facts
    out = [render_plan(request.plan, facts.routes, facts.port_note)]
    steps = list(request.allocate)
    if request.sized:
        said = ", ".join(f"{name}: {n}" for name, n in request.sized.items())
        steps.append(f"slots from the hosts' GPU counts ({said})")
    if request.ship:
        hosts = ", ".join(request.ship)
        steps.append(
            f"sync the job directory and dmlctl {facts.lib} to {plural(len(request.ship), 'host')} "
            f"({hosts})"
        )
    if request.setup is not None:
        setup = render_command(["sh", "-c", request.setup])  # its secrets hidden below
        steps.append(f"run setup on each of them: {setup}")
    if steps:
        out += ["", "before the agents start:", *(f"  {s}" for s in steps)]
    if facts.assumed:
        out += ["", "assumed (a dry run connects to nothing):", *(f"  {a}" for a in facts.assumed)]
    # A secret value may also stand in the setup command or another line.
    return Redactor(request.plan.hidden_values()).text("\n".join(out))
