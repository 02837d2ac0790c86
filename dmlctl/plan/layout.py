"""Hosts and ranks of a plan from a placement (pure): how the first plan and every
re-plan turn "host h runs w workers and s servers" into per-host plans.

A host plan in the pool (a spare: node rank -1, no processes) carries everything
that does not depend on placement — directories, interpreter, the job's and host's
environment, the torchrun command's script and arguments. Placing it sets its node
rank, first rank and process count, completes its torchrun command (number of
nodes, processes, rendezvous endpoint; the first host serves the c10d store and,
when there are several hosts, is MASTER_ADDR) and its environment: one OpenMP thread
per process unless the job or host sets it, and ``DMLCTL_LOCAL_ROLES`` when the job
has parameter servers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dmlctl.plan.model import HostPlan, RankPlan
from dmlctl.plan.placement import Placed
from dmlctl.protocol import ENV_LOCAL_ROLES

Layout = tuple[tuple[HostPlan, ...], tuple[RankPlan, ...], tuple[HostPlan, ...]]


def seat(
    host: HostPlan,
    placed: Placed,
    *,
    node_rank: int,
    first_rank: int,
    nnodes: int,
    endpoint: str,
    with_roles: bool,
) -> HostPlan:
    """``host`` running ``placed`` as node ``node_rank`` of ``nnodes``, meeting at
    ``endpoint`` (``address:port``); ``with_roles``: the job has parameter servers."""
    env = {k: v for k, v in host.env.items() if k != ENV_LOCAL_ROLES}
    if placed.nproc > 1:  # torchrun's own default; set so it prints no banner about it
        env.setdefault("OMP_NUM_THREADS", "1")
    if with_roles:
        env[ENV_LOCAL_ROLES] = ",".join(placed.roles)
    lead = node_rank == 0
    torchrun = dataclasses.replace(
        host.torchrun,
        nnodes=nnodes,
        nproc=placed.nproc,
        rdzv_endpoint=endpoint,
        is_host=lead,
        local_addr=endpoint.rsplit(":", 1)[0] if lead and nnodes > 1 else None,
    )
    return dataclasses.replace(
        host,
        node_rank=node_rank,
        nproc=placed.nproc,
        first_rank=first_rank,
        torchrun=torchrun,
        env=env,
    )


def unseat(host: HostPlan, *, nnodes: int, endpoint: str) -> HostPlan:
    """``host`` as a spare of a run of ``nnodes`` nodes meeting at ``endpoint``."""
    env = {k: v for k, v in host.env.items() if k != ENV_LOCAL_ROLES}
    torchrun = dataclasses.replace(
        host.torchrun,
        nnodes=nnodes,
        nproc=0,
        rdzv_endpoint=endpoint,
        is_host=False,
        local_addr=None,
    )
    return dataclasses.replace(
        host, node_rank=-1, nproc=0, first_rank=0, torchrun=torchrun, env=env
    )


def lay_out(
    pool: Sequence[HostPlan], placement: Sequence[Placed], *, endpoint: str, with_roles: bool
) -> Layout:
    """The placed hosts (node order), their ranks (rank order: host by host, each
    host's workers then its servers) and the spares (the rest of ``pool``, in order).
    Every name in ``placement`` must be a host of ``pool``."""
    by_name = {h.name: h for h in pool}
    hosts: list[HostPlan] = []
    ranks: list[RankPlan] = []
    for node_rank, placed in enumerate(placement):
        hosts.append(
            seat(
                by_name[placed.host],
                placed,
                node_rank=node_rank,
                first_rank=len(ranks),
                nnodes=len(placement),
                endpoint=endpoint,
                with_roles=with_roles,
            )
        )
        ranks += [RankPlan(len(ranks) + i, placed.host, i, r) for i, r in enumerate(placed.roles)]
    used = {p.host for p in placement}
    spares = tuple(
        unseat(h, nnodes=len(placement), endpoint=endpoint) for h in pool if h.name not in used
    )
    return tuple(hosts), tuple(ranks), spares
