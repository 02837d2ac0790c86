"""Re-planning a restarted attempt on the hosts that are available now (pure).

A run's plan lists its hosts and its spares (the cluster's other hosts). When hosts
are lost, :func:`replan` places the next attempt on the available ones by the rule of
the first plan (:func:`dmlctl.plan.placement.place`): in cluster order, at most
``max_hosts`` hosts running workers, each up to its slots and the run's ``workers``
in all, and every parameter server the job asks for, placed again. Ranks are
renumbered host by host, torchrun gets the new number of nodes and the rendezvous
endpoint on the new first host; everything else of a host's plan (directories,
interpreter, the job's and host's environment) stays as planned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping

from dmlctl.plan.checks import hosts_problem, world_problem
from dmlctl.plan.layout import lay_out
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.plan.placement import Demand, HostSlots, NoPlacement, Placed
from dmlctl.plan.placement import place as place_ranks
from dmlctl.protocol import ROLE_WORKER
from dmlctl.slurm.allocation import Allocation
from dmlctl.text import plural


class CannotReplan(Exception):
    """The available hosts cannot carry the run (too few, no host for its parameter
    servers, or the strategy refuses the smaller world); the message says which and
    why."""


def candidates(plan: LaunchPlan) -> list[HostPlan]:
    """Every host the run may use, in cluster order (planned hosts, then spares)."""
    return [*plan.hosts, *plan.spares]


def _min_hosts(plan: LaunchPlan) -> int:
    return plan.min_hosts or len(plan.hosts)


def _demand(plan: LaunchPlan) -> Demand:
    workers = plan.workers or plan.world_size - plan.parameter_servers
    max_hosts = plan.max_hosts or len(plan.hosts)
    return Demand(workers, plan.parameter_servers, plan.server_hosts, max_hosts)


def _slots(plan: LaunchPlan, host: HostPlan) -> int:
    """The most workers ``host`` may run: its slots, or as many as it was planned
    (a plan written before hosts carried their slots)."""
    planned = sum(1 for r in plan.ranks if r.host == host.name and r.role == ROLE_WORKER)
    return max(host.slots, planned)


def placement(plan: LaunchPlan, available: Collection[str]) -> tuple[Placed, ...]:
    """Where an attempt on the ``available`` hosts runs what (node order); raises
    :class:`CannotReplan` when its parameter servers have no host."""
    hosts = [HostSlots(h.name, _slots(plan, h)) for h in candidates(plan) if h.name in available]
    try:
        return place_ranks(hosts, _demand(plan))
    except NoPlacement as e:
        raise CannotReplan(str(e)) from None


def pick_hosts(plan: LaunchPlan, available: Collection[str]) -> list[HostPlan]:
    """The hosts an attempt uses given the ``available`` host names, in node order
    (none when the job's parameter servers would have no host)."""
    try:
        placed = placement(plan, available)
    except CannotReplan:
        return []
    by_name = {h.name: h for h in candidates(plan)}
    return [by_name[p.host] for p in placed]


def enough(plan: LaunchPlan, available: Collection[str]) -> bool:
    """Whether the ``available`` hosts can carry an attempt (``min_hosts`` of them)."""
    return len(pick_hosts(plan, available)) >= _min_hosts(plan)


def _check(plan: LaunchPlan, placed: tuple[Placed, ...]) -> None:
    """Raise :class:`CannotReplan` when ``placed`` breaks the run's bounds, runs
    another number of workers than the run's device mesh, or the strategy refuses it."""
    need = _min_hosts(plan)
    if len(placed) < need:
        names = ", ".join(p.host for p in placed) or "none"
        raise CannotReplan(
            f"only {plural(len(placed), 'host')} can run the job ({names}); min_hosts is {need}"
        )
    workers = sum(p.workers for p in placed)
    if plan.mesh is not None and workers != plan.mesh.world:
        raise CannotReplan(
            f"the device mesh needs {plural(plan.mesh.world, 'worker')}; the available "
            f"hosts run {workers}"
        )
    problem = world_problem(plan.strategy, plan.strategy_params, workers) or hosts_problem(
        plan.strategy, plan.strategy_params, len(placed)
    )
    if problem:
        raise CannotReplan(problem)


def replan(plan: LaunchPlan, available: Collection[str], endpoint: str) -> LaunchPlan:
    """The plan of an attempt on the ``available`` hosts, meeting at ``endpoint``
    (``address:port`` on the first chosen host). Raises :class:`CannotReplan`.

    Promises: the result's hosts are :func:`pick_hosts`; node ranks and ranks are
    dense and in host order; every role the job asks for is there (its parameter
    servers exactly, ``DMLCTL_LOCAL_ROLES`` on every host then); at most
    ``plan.workers`` workers (exactly the mesh's with a device mesh); hosts left out
    become spares; the run id, script, strategy, device mesh and bounds are unchanged.
    """
    placed = placement(plan, available)
    _check(plan, placed)
    hosts, ranks, spares = lay_out(
        candidates(plan), placed, endpoint=endpoint, with_roles=plan.parameter_servers > 0
    )
    return dataclasses.replace(
        plan,
        hosts=hosts,
        ranks=ranks,
        spares=spares,
        world_size=len(ranks),
        rdzv_endpoint=endpoint,
    )


def place(
    base: LaunchPlan,
    current: LaunchPlan,
    available: Collection[str],
    rendezvous: Callable[[HostPlan], str],
) -> LaunchPlan:
    """The plan of the next attempt on the ``available`` hosts: ``current`` when it
    would run on the same hosts; else :func:`replan` of ``base``, meeting at the
    planned endpoint while the first host stays the planned one, else at
    ``rendezvous(new first host)``. Raises :class:`CannotReplan`."""
    chosen = pick_hosts(base, available)
    if [h.name for h in chosen] == [h.name for h in current.hosts]:
        return current
    if not chosen or chosen[0].name == base.hosts[0].name:
        endpoint = base.rdzv_endpoint
    else:
        endpoint = rendezvous(chosen[0])
    return replan(base, available, endpoint)


def meeting_at(plan: LaunchPlan, endpoint: str) -> LaunchPlan:
    """``plan`` with its hosts and spares meeting at ``endpoint`` (``address:port`` on
    its first host) instead; nothing else changes."""

    def moved(h: HostPlan) -> HostPlan:
        torchrun = dataclasses.replace(h.torchrun, rdzv_endpoint=endpoint)
        if h.torchrun.local_addr is not None:  # the first host of several listens there
            torchrun = dataclasses.replace(torchrun, local_addr=endpoint.rsplit(":", 1)[0])
        return dataclasses.replace(h, torchrun=torchrun)

    hosts, spares = tuple(map(moved, plan.hosts)), tuple(map(moved, plan.spares))
    return dataclasses.replace(plan, hosts=hosts, spares=spares, rdzv_endpoint=endpoint)


def rebind(plan: LaunchPlan, where: Allocation, addresses: Mapping[str, str]) -> LaunchPlan:
    """``plan`` on the allocation ``where`` (a batch scheduler's request granted
    again): each host named in ``addresses`` at its new address. The rendezvous is
    not touched: a re-plan (:func:`replan`) gives the endpoint on the new first host."""

    def moved(h: HostPlan) -> HostPlan:
        return dataclasses.replace(h, address=addresses.get(h.name, h.address))

    return dataclasses.replace(
        plan,
        hosts=tuple(moved(h) for h in plan.hosts),
        spares=tuple(moved(h) for h in plan.spares),
        allocation=where,
    )
