"""A lost host's ranks started again on another host while every other rank goes on
(``restart.mode: in_place``): which host can be replaced so, on which host, and the
configuration its agent gets.

A host is replaced in place when the run replaces lost workers in place, every rank
of it had started (the controller knows each one's global and local rank), it does
not run rank 0 unless the controller holds the run's store (otherwise the torchrun of
rank 0's host serves it, and every rank reaches it there; the ranks said where it
is), and, when it runs parameter servers, its
connection ended (its kernel closed the servers' sockets, so the workers ask their
replacements, which start from the snapshots in the run's store; a silent host
leaves the workers waiting on its open sockets). The ranks go to a
spare host of the plan (the cluster's hosts that run nothing), else to the lost
host itself when only its agent's connection ended (its machine may still answer).
There its agent starts, in a rank directory of its own,
them under a stand-in for torchrun (:mod:`dmlctl.agent.standin`), each a replacement
that joins its peers as one forked in place does. Otherwise the host is lost as
before: the run restarts (:mod:`dmlctl.launch.policy`).
"""

from __future__ import annotations

import dataclasses

from dmlctl.agent_config import AgentConfig, Rejoin
from dmlctl.failure import Failure
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.protocol import ENV_LOCAL_ROLES, IN_PLACE, ROLE_SERVER, local_roles
from dmlctl.runs.events import Event, HostDropped, Progress

_CARRIED = (ENV_LOCAL_ROLES, "OMP_NUM_THREADS")  # the lost host's, for its ranks


@dataclasses.dataclass
class HostSwap:
    """The hosts of one attempt that can be replaced in place, and where to."""

    plan: LaunchPlan
    #: host → {global rank: local rank} of the ranks it runs (from their start records)
    seated: dict[str, dict[int, int]] = dataclasses.field(default_factory=dict)
    #: The hosts taken as targets, as they run there (rank files are collected there)
    placed: dict[str, HostPlan] = dataclasses.field(default_factory=dict)
    #: The attempt's store when the controller holds it (``host:port``; None: torchrun's,
    #: on rank 0's host)
    outside: str | None = None
    count: int = 0  # hosts replaced in this attempt
    store: str | None = None  # the run's store (address:port), as the ranks said

    RESTART_FULL = "restart.mode is full"

    def started(self, host: str, rank: int, local_rank: int, store: str | None) -> None:
        """Rank ``rank`` (local rank ``local_rank``) started on ``host``; it said the
        run's store is at ``store``."""
        self.store = self.store or store
        for ranks in self.seated.values():
            ranks.pop(rank, None)
        self.seated.setdefault(host, {})[rank] = local_rank

    def why_not(self, host: str, ended: bool) -> str | None:
        """Why ``host``'s ranks cannot be started elsewhere while the others go on
        (``ended``: its connection ended, rather than fell silent); None when they can."""
        if self.plan.restart.mode != IN_PLACE:
            return self.RESTART_FULL
        planned = self._planned(host)
        if planned is None:
            return "it is not one of the attempt's hosts"
        seated = self.seated.get(host, {})
        if len(seated) != planned.nproc:
            return "not every rank of it had started"
        if 0 in seated and self.outside is None:
            return "it runs rank 0 (its torchrun serves the run's store)"
        if self._workers() <= set(seated):
            return "it runs every worker (none is left to hand a replacement its state)"
        if self.store is None:
            return "no rank said where the run's store is"
        return None

    def targets(self, host: str, ended: bool) -> list[HostPlan]:
        """Where ``host``'s ranks may go, best first: the spares not taken yet, then
        ``host`` itself when its connection ``ended`` (its agent died, the machine may
        not have)."""
        spares = [h for h in self.plan.spares if h.name not in self.placed]
        planned = self._planned(host)
        return spares + ([planned] if ended and planned is not None else [])

    def go_on_without(self, host: str, cause: Failure, now: float, ended: bool) -> list[Event]:
        """The events saying that the others go on without lost ``host``'s ranks (no
        host could take them), after ``restart.rejoin_wait``, when they may: the
        wait is not 0, the hosts left are at least ``min_hosts``, and with parameter
        servers the host's connection ``ended`` (its kernel closed its sockets: the
        servers see their workers' end; one silent — frozen, cut off, powered off —
        leaves them open, and the servers would wait for its workers), and it does not
        run rank 0 (the rank that saves, prints and evaluates); none otherwise (every
        strategy replaced in place goes on without a worker its replacement did not
        come for: the averaging ones over the members left,
        dpsgd over its topology laid again, the parameter servers without it; a lost
        server's shard has nobody to go on without it)."""
        wait = self.plan.restart.rejoin_wait
        left = [h for h, ranks in self.seated.items() if ranks and h != host]
        enough = len(left) >= (self.plan.min_hosts or len(self.plan.hosts))
        seen = ended or not self.plan.parameter_servers
        if not (wait and enough and seen) or self._serves(host):  # a shard has no stand-in
            return []
        if 0 in self.seated.get(host, {}):  # rank 0 prints, saves, evaluates: not without it
            return []
        ranks = tuple(sorted(self.seated.pop(host, {})))
        said = (
            f"{host} lost ({cause.message}) and no host can take rank "
            f"{', '.join(map(str, ranks))}: the others go on without them after "
            f"restart.rejoin_wait ({wait:g} s)"
        )
        return [HostDropped(host, ranks, cause, now), Progress(said, now)]

    def next_spare(self) -> HostPlan | None:
        """The spare a lost host's ranks would go to now, in a run that replaces them
        in place (None: none, or not such a run); it gets a standby agent."""
        if self.plan.restart.mode != IN_PLACE:
            return None
        return next((h for h in self.plan.spares if h.name not in self.placed), None)

    def config(self, host: str, target: HostPlan, attempt: int, grace: float) -> AgentConfig:
        """The configuration of ``target``'s agent, which starts ``host``'s ranks in
        attempt ``attempt`` (0-based) into the running world."""
        planned = self._planned(host)
        assert planned is not None
        ranks = sorted(self.seated[host], key=lambda r: self.seated[host][r])
        assert self.store is not None
        address, port = self.store.rsplit(":", 1)
        env = {**target.env, **{k: planned.env[k] for k in _CARRIED if k in planned.env}}
        torchrun = dataclasses.replace(target.torchrun, nproc=len(ranks))
        seat = dataclasses.replace(
            target, env=env, torchrun=torchrun, node_rank=planned.node_rank, nproc=len(ranks)
        )
        self.placed[target.name] = seat
        self.count += 1
        rejoin = Rejoin(
            ranks=tuple(ranks),
            world_size=self.plan.world_size,
            master_addr=address,
            master_port=int(port),
            group_rank=planned.node_rank,
            group_world_size=len(self.plan.hosts),
            number=self.count,
        )
        config = self.plan.agent_config(seat, attempt, grace, self.outside)
        # A directory of its own: the lost host's, when it is the target, holds the
        # files of the ranks it replaces (their records must not be read again).
        rank_dir = f"{config.rank_dir}/rejoin-{self.count}"
        return dataclasses.replace(config, rank_dir=rank_dir, rejoin=rejoin)

    def _workers(self) -> set[int]:
        """The ranks of the run's workers (as planned)."""
        return {r.rank for r in self.plan.ranks if r.role != ROLE_SERVER}

    def _serves(self, host: str) -> bool:
        """Whether ``host`` runs parameter servers in this attempt."""
        planned = self._planned(host)
        return planned is not None and ROLE_SERVER in local_roles(planned.env)

    def moved(self, host: str, to: str) -> tuple[int, ...]:
        """``host``'s ranks, now on ``to``."""
        ranks = self.seated.pop(host, {})
        self.seated[to] = dict(ranks)
        return tuple(sorted(ranks))

    def _planned(self, host: str) -> HostPlan | None:
        """``host`` as it runs ranks now: as planned, or as it took a lost host's."""
        if host in self.placed:
            return self.placed[host]
        return next((h for h in self.plan.hosts if h.name == host), None)
