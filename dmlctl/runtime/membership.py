"""Which ranks are workers and which are parameter servers (runtime side, torch).

Only a run whose strategy has a ``server`` role has a membership; the session
(:mod:`dmlctl.runtime.session`) finds it and hands it to the context.

The plan gives every host's processes their roles by local rank
(``DMLCTL_LOCAL_ROLES``); global ranks are only known after torchrun's rendezvous.
:func:`discover` finds them with one all-gather over the default group, and builds
the workers' own process group, which every collective of the training script
(``ctx.barrier``, ``ctx.all_reduce_mean``, checkpoints) uses instead of the default
group — the servers never take part in those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dmlctl.protocol import ROLE_SERVER
from dmlctl.runtime import rejoin
from dmlctl.text import plural


@dataclass(frozen=True)
class Membership:
    """Global ranks by role (sorted) and the workers' process group."""

    workers: tuple[int, ...]
    servers: tuple[int, ...]
    group: Any  # the workers' ProcessGroup

    def worker_index(self, rank: int) -> int:
        """Position of global ``rank`` among the workers (ValueError for a server)."""
        return self.workers.index(rank)


def discover(role: str) -> Membership:
    """Every rank's role, gathered from every rank (collective over the default group,
    and so is building the workers' group: every rank must call this). Raises
    :class:`RuntimeError` when no rank is a worker or none is a server."""
    world = dist.get_world_size()
    mine = torch.tensor([1 if role == ROLE_SERVER else 0], dtype=torch.int64)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, mine)
    servers = tuple(r for r, flag in enumerate(gathered) if int(flag.item()) == 1)
    workers = tuple(r for r in range(world) if r not in servers)
    if not workers or not servers:
        raise RuntimeError(
            f"a parameter-server run needs workers and servers; got "
            f"{plural(len(workers), 'worker')} and {plural(len(servers), 'server')} among "
            f"{plural(world, 'rank')}"
        )
    group = dist.new_group(list(workers))
    if rejoin.in_place() and dist.get_rank() == 0:
        rejoin.publish_membership(workers, servers)  # for a worker started again in place
    return Membership(workers, servers, group)


def rejoined() -> Membership:
    """The membership of a worker started again in place (:mod:`dmlctl.runtime.rejoin`):
    the roles the first rank wrote to the store, and no workers' group."""
    workers, servers = rejoin.read_membership()
    return Membership(workers, servers, None)
