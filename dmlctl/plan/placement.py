"""Where a run's processes go: the one placement rule of the first plan and of every
re-plan (pure: names and numbers in, names and numbers out).

Workers fill the hosts that may run them (not ``server_hosts``) in the order given,
each host up to its slots, at most ``max_hosts`` hosts, until every worker has a
place. Parameter servers are spread in turn over the ``server_hosts`` among the
hosts, or, without ``server_hosts``, over the hosts that got workers. Node order:
the worker hosts, then the server-only hosts that got servers. On each host the
workers come first (local ranks ``0..w-1``), then its servers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dmlctl.protocol import ROLE_SERVER, ROLE_WORKER
from dmlctl.text import plural


class NoPlacement(Exception):
    """The job's parameter servers have no host to run on; the message says why."""


@dataclass(frozen=True)
class HostSlots:
    """A host that may take part: its name and the most workers it may run."""

    name: str
    slots: int


@dataclass(frozen=True)
class Demand:
    """What a job asks for: ``workers`` (at most: the caller decides whether fewer
    will do), exactly ``servers`` parameter servers, hosts reserved for servers, and
    the most hosts that run workers (None: no bound)."""

    workers: int
    servers: int = 0
    server_hosts: tuple[str, ...] = ()
    max_hosts: int | None = None


@dataclass(frozen=True)
class Placed:
    """What one host runs: ``workers`` workers, then ``servers`` parameter servers."""

    host: str
    workers: int
    servers: int = 0

    @property
    def nproc(self) -> int:
        """Processes on the host (what torchrun's ``--nproc-per-node`` says)."""
        return self.workers + self.servers

    @property
    def roles(self) -> tuple[str, ...]:
        """The role of each local rank, in local-rank order."""
        return (ROLE_WORKER,) * self.workers + (ROLE_SERVER,) * self.servers


def worker_hosts(hosts: Sequence[HostSlots], demand: Demand) -> list[Placed]:
    """The hosts that run workers and how many each (see the module docstring)."""
    out: list[Placed] = []
    left = demand.workers
    for host in hosts:
        if left <= 0 or (demand.max_hosts is not None and len(out) >= demand.max_hosts):
            break
        if host.name in demand.server_hosts or host.slots <= 0:
            continue
        n = min(host.slots, left)
        out.append(Placed(host.name, n))
        left -= n
    return out


def place(hosts: Sequence[HostSlots], demand: Demand) -> tuple[Placed, ...]:
    """Place ``demand`` on ``hosts`` (given in cluster order), in node order.

    Promises: at most ``demand.workers`` workers (fewer only when the hosts lack
    slots), exactly ``demand.servers`` servers; no host without a process. Raises
    :class:`NoPlacement` when there are servers but no host to run them.
    """
    workers = worker_hosts(hosts, demand)
    if demand.servers == 0:
        return tuple(workers)
    if demand.server_hosts:
        targets = [h.name for h in hosts if h.name in demand.server_hosts]
        if not targets:
            listed = ", ".join(demand.server_hosts)
            raise NoPlacement(
                f"none of the server_hosts ({listed}) is available for the "
                f"{plural(demand.servers, 'parameter server')}"
            )
    else:
        targets = [p.host for p in workers]
        if not targets:
            raise NoPlacement(
                f"no host can run workers, so none for the {demand.servers} "
                "parameter server(s) next to them"
            )
    counts = dict.fromkeys(targets, 0)
    for i in range(demand.servers):
        counts[targets[i % len(targets)]] += 1
    placed = [Placed(p.host, p.workers, counts.pop(p.host, 0)) for p in workers]
    placed += [Placed(name, 0, n) for name, n in counts.items() if n]
    return tuple(placed)
