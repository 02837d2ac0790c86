"""Re-planning a restarted attempt on the hosts that are available now (pure).

A run's plan lists its hosts and its spares (the cluster's other hosts). When hosts
are lost, :func:`replan` places the next attempt on the available ones, in cluster
order, at most ``max_hosts`` of them, each up to its slots and the run's ``workers``
in all. Ranks are renumbered host by host, torchrun gets the new number of nodes and
the rendezvous endpoint on the new first host; everything else of a host's plan
(environment, directories, interpreter) stays as planned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from dmlctl.plan.build import WORKER_ROLE, torchrun_argv, world_problem
from dmlctl.plan.model import HostPlan, LaunchPlan, RankPlan


class CannotReplan(Exception):
    """The available hosts cannot carry the run (too few, or the strategy refuses the
    smaller world); the message says which and why."""


def candidates(plan: LaunchPlan) -> list[HostPlan]:
    """Every host the run may use, in cluster order (planned hosts, then spares)."""
    order = {h.name: i for i, h in enumerate(plan.hosts + plan.spares)}
    return sorted(plan.hosts + plan.spares, key=lambda h: order[h.name])


def _max_hosts(plan: LaunchPlan) -> int:
    return plan.max_hosts or len(plan.hosts)


def _min_hosts(plan: LaunchPlan) -> int:
    return plan.min_hosts or len(plan.hosts)


def pick_hosts(plan: LaunchPlan, available: Collection[str]) -> list[HostPlan]:
    """The hosts an attempt uses given the ``available`` host names: cluster order, at
    most ``max_hosts``, stopping once they have slots for every worker."""
    workers = plan.workers or plan.world_size
    chosen: list[HostPlan] = []
    slots = 0
    for host in candidates(plan):
        if host.name not in available:
            continue
        if len(chosen) == _max_hosts(plan) or slots >= workers:
            break
        chosen.append(host)
        slots += max(host.slots, host.nproc)
    return chosen


def enough(plan: LaunchPlan, available: Collection[str]) -> bool:
    """Whether the ``available`` hosts can carry an attempt (``min_hosts`` of them)."""
    return len(pick_hosts(plan, available)) >= _min_hosts(plan)


def replan(plan: LaunchPlan, available: Collection[str], endpoint: str) -> LaunchPlan:
    """The plan of an attempt on the ``available`` hosts, meeting at ``endpoint``
    (``address:port`` on the first chosen host). Raises :class:`CannotReplan`.

    Promises: the result's hosts are :func:`pick_hosts`; node ranks and ranks are
    dense and in host order; hosts left out become spares; ``world_size`` is the sum
    of the hosts' workers (at most ``plan.workers``); the run id, script, strategy and
    bounds are unchanged.
    """
    chosen = pick_hosts(plan, available)
    need = _min_hosts(plan)
    if len(chosen) < need:
        names = ", ".join(h.name for h in chosen) or "none"
        raise CannotReplan(
            f"only {len(chosen)} host(s) can run the job ({names}); min_hosts is {need}"
        )
    workers = plan.workers or plan.world_size
    counts: list[int] = []
    left = workers
    for host in chosen:
        n = min(max(host.slots, host.nproc), left)
        counts.append(n)
        left -= n
    world = sum(counts)
    problem = world_problem(plan.strategy, plan.strategy_params, world)
    if problem:
        raise CannotReplan(problem)
    address = endpoint.rsplit(":", 1)[0]
    hosts: list[HostPlan] = []
    ranks: list[RankPlan] = []
    for node_rank, (host, nproc) in enumerate(zip(chosen, counts, strict=True)):
        env = dict(host.env)
        if nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        argv = torchrun_argv(
            host.python,
            nnodes=len(chosen),
            nproc=nproc,
            rdzv_endpoint=endpoint,
            run_id=plan.run_id,
            script=plan.script,
            args=plan.args,
            is_host=node_rank == 0,
            local_addr=address if node_rank == 0 and len(chosen) > 1 else None,
        )
        placed = dataclasses.replace(
            host, node_rank=node_rank, nproc=nproc, first_rank=len(ranks),
            torchrun_argv=argv, env=env,
        )  # fmt: skip
        hosts.append(placed)
        ranks += [RankPlan(len(ranks) + i, host.name, i, WORKER_ROLE) for i in range(nproc)]
    used = {h.name for h in hosts}
    spares = tuple(
        dataclasses.replace(h, node_rank=-1, nproc=0, first_rank=0)
        for h in candidates(plan)
        if h.name not in used
    )
    return dataclasses.replace(
        plan, hosts=tuple(hosts), ranks=tuple(ranks), spares=spares,
        world_size=world, rdzv_endpoint=endpoint,
    )  # fmt: skip


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
