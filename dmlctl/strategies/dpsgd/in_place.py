"""D-PSGD whose workers outlive a lost one (``restart.mode: in_place``).

The gossip goes over the elastic group of :mod:`dmlctl.strategies.elastic`, not by
point-to-point messages on the default group: gloo's point-to-point receive cannot be
waited for in slices (a timed-out wait closes the pair), so a worker waiting on a
neighbour could not learn of a loss that gloo does not tell it of.

Every collective — a mixing round, a consensus measurement, the final average — is
one all-to-all that carries a **header** from each member to every member (whether it
brings a model, and where it is: its step count and the collective due; 16 bytes cast
into the parameters' dtype) and its flat parameters to its topology neighbours only
(the bytes of point-to-point gossip). When the members that bring a model are at one
place, all do that collective: a mixing round is then done with what the neighbours
sent, ``xᵢ ← Σⱼ Wᵢⱼ bⱼ xⱼ / Σⱼ Wᵢⱼ bⱼ`` (``bⱼ`` = 1 when member ``j`` brings a model);
the consensus and the final average are one all-reduce more each. When they are not
(a member died inside an all-to-all that some completed: they went on), those behind
skip the collective they are at (a gossip round skipped: their own model stays; a
consensus: its previous value) and the others send their header again until all are
level.

Members, weights and neighbours are by **place** in the generation's member list: when
no replacement comes within ``restart.rejoin_wait`` and the others go on smaller
(:mod:`dmlctl.strategies.members`), the topology is laid again over those left (the
ring closed around the gap; the Metropolis-Hastings weights of the smaller graph,
doubly stochastic again), and over the whole world once a late one is let back in.

A member lost in a collective: the others form the next generation with its
replacement (the lowest-ranked live worker hands it its optimizer state as it forms)
and say their header again there. The replacement brings no model (``b = 0``) and does
what the header says: its neighbours mix without it (their weights renormalised; that
round does not keep the workers' mean exactly) and it takes its neighbours' mean
weighted as its row of ``W``, and the round's step (its data goes on there); one that
joins the final average takes the others' mean and has no batch left. Buffers stay
each worker's own (said once).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch

from dmlctl.strategies import elastic_start, members, topology
from dmlctl.strategies.common import assign_flat, flat_params
from dmlctl.strategies.dpsgd.gossip import DPSGDOptimizer
from dmlctl.strategies.elastic import ElasticAverager

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context
    from dmlctl.strategies.dpsgd.params import Params

CONSENSUS, MIX, FINAL = 0, 1, 2
"""The collectives, in the order they come after a step (the mixing round is the next
step's), as a header says them: ``4 × steps + collective``."""


class ElasticGossip(DPSGDOptimizer):
    """D-PSGD's mixing and final average over the elastic group (module docstring)."""

    elastic: ElasticAverager  # set by :func:`prepare`
    mixed_ahead = False  # a replacement mixed for its first step as it joined
    averaged = False  # a replacement joined the final average
    skipped = 0  # collectives this worker was behind for (module docstring)
    sent = 0  # bytes the latest collective sent
    graph: tuple[int, ...] = ()  # the members :attr:`weights` are laid over

    def place(self) -> int:
        """This worker's place among its generation's members; :attr:`weights` and
        :attr:`peers` are then the topology over those members, by place (the
        whole world's, rank for place, until some go on without others)."""
        members = self.elastic.members
        if members != self.graph:
            place = members.index(self.rank)
            self.weights = topology.neighbours(self.settings.topology, len(members), place)
            self.peers = [j for j in self.weights if j != place]
            self.graph = members
        return members.index(self.rank)

    def before_step(self) -> None:
        if self.mixed_ahead:
            self.mixed_ahead = False
            return
        super().before_step()

    def mix(self) -> None:
        """One gossip round over the elastic group (module docstring)."""
        self._collective(MIX)

    def final_model(self) -> None:
        """Every worker ← the mean of all workers' parameters (buffers: their own)."""
        if not self.averaged:
            self._collective(FINAL)

    def consensus(self) -> float:
        """sqrt(meanᵢ ‖xᵢ − x̄‖²) over the members that bring a model
        (:meth:`_consensus`); the previous value when this worker was behind."""
        done = self._collective(CONSENSUS)
        return float(self.meter.extra["consensus"]) if done is None else done[1]

    def joining_round(self) -> int:
        """A replacement's first collectives, up to the first that brings it a model
        (a mixing round or the final average: a consensus it joins with nothing);
        returns its step."""
        while True:
            done = self.elastic.rounds(lambda: self._once(None))
            assert done is not None  # a replacement is never behind
            kind, _, step = done
            if kind != CONSENSUS:
                self.mixed_ahead, self.averaged = kind == MIX, kind == FINAL
                return step

    def _collective(self, kind: int) -> tuple[int, float, int] | None:
        """The collective ``kind`` at this worker's step (a lost member: again in
        the next generation); its kind, value (the consensus distance) and step, or
        None when this worker was behind the others and skipped it."""
        began = time.perf_counter()
        done = self.elastic.rounds(lambda: self._once(kind))
        if done is None:
            self.skipped += 1
            self.meter.extra["skipped"] = self.skipped
        elif kind != CONSENSUS:  # monitoring is not training traffic
            self.meter.add(self.sent, time.perf_counter() - began)
            self.meter.extra["generation"] = self.elastic.generation
        return done

    def _once(self, kind: int | None) -> tuple[int, float, int] | None:
        """Headers until the members that bring a model are at one place, then the
        collective there (``kind`` None: a replacement's, which brings no model);
        its kind, value and step. None when this worker is behind (it skips)."""
        mine = None if kind is None else 4 * self.local_steps + kind
        while True:
            flat = flat_params(self.params)
            bring, places, got = self._headers(flat, mine)
            level = {int(places[j]) for j in range(len(bring)) if bring[j] > 0}
            if not level:
                raise members.InPlaceLost(
                    self.elastic.generation, "no worker holds a model (all were lost)"
                )
            if len(level) == 1:
                place = level.pop()
                return place % 4, self._do(place % 4, flat, bring, got), place // 4
            if mine is not None and mine < max(level):
                return None

    def _headers(
        self, flat: torch.Tensor, place: int | None
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """One all-to-all: this worker's header (whether it brings a model, and its
        ``place``: None brings none) to every member, its parameters to its
        neighbours too. Every member's flag and place, and what each neighbour sent
        (its parameters; empty from the others), by place in the generation."""
        head = torch.tensor([place is not None, place or 0], dtype=torch.int64, device=flat.device)
        head = head.view(torch.uint8).view(flat.dtype)  # the bits, any dtype
        k, n, size = head.numel(), flat.numel(), len(self.elastic.members)
        self.place()
        sent = [torch.cat([head, flat]) if j in self.peers else head for j in range(size)]
        sizes = [k + n if j in self.peers else k for j in range(size)]
        got = self.elastic.exchange(sent, sizes)
        heads = torch.stack([g[:k].clone().view(torch.uint8).view(torch.int64) for g in got])
        return heads[:, 0], heads[:, 1], [g[k:] for g in got]

    def _do(
        self, kind: int, flat: torch.Tensor, bring: torch.Tensor, got: list[torch.Tensor]
    ) -> float:
        """The collective ``kind`` (``got``: what the neighbours sent with their
        headers), ``bring`` saying which members bring a model; sets :attr:`sent`
        (bytes); returns the consensus distance (else 0)."""
        if kind == CONSENSUS:
            return self._consensus(flat, bring)
        if kind == FINAL:
            mixed, where = self._average(flat, bring), "in the final average"
        else:
            mixed, where = self._gossip(flat, bring, got), "after gossip mixing"
        assign_flat(self.params, mixed)
        self.check_finite(mixed, where=where, step=self.local_steps + 1)
        return 0.0

    def _gossip(
        self, flat: torch.Tensor, bring: torch.Tensor, got: list[torch.Tensor]
    ) -> torch.Tensor:
        """``xᵢ ← Σⱼ Wᵢⱼ bⱼ xⱼ / Σⱼ Wᵢⱼ bⱼ`` over this worker's neighbours, whose
        parameters came with their headers (by place)."""
        me = self.place()
        own = self.weights[me] * float(bring[me])
        mixed = flat * own
        total = own
        for j in self.peers:
            weight = self.weights[j] * float(bring[j])
            mixed.add_(got[j], alpha=weight)
            total += weight
        if total <= 0:
            raise members.InPlaceLost(
                self.elastic.generation,
                f"none of rank {self.rank}'s neighbours {[self.graph[j] for j in self.peers]} "
                "brings a model (they were lost together)",
            )
        if bool((bring[[me, *self.peers]] < 1).any()):
            mixed /= total  # a replacement in the round: the others' weights renormalised
        self.sent = len(self.peers) * flat.numel() * flat.element_size()
        return mixed

    def _average(self, flat: torch.Tensor, bring: torch.Tensor) -> torch.Tensor:
        """The mean of the parameters of the members that bring a model (one
        all-reduce: the same bits on every member)."""
        flat.mul_(float(bring[self.place()]))
        self.elastic.allreduce(flat)
        self.sent = flat.numel() * flat.element_size()
        return flat.div_(float(bring.sum()))

    def _consensus(self, flat: torch.Tensor, bring: torch.Tensor) -> float:
        """sqrt(meanᵢ ‖xᵢ − x̄‖²) over the members that bring a model, from one
        all-reduce of the parameters and their squared norm (float64)."""
        wide = flat.to(torch.float64)
        both = torch.cat([wide, wide.dot(wide).reshape(1)]).mul_(float(bring[self.place()]))
        self.elastic.allreduce(both)
        count = float(bring.sum())
        mean = both[:-1] / count
        return math.sqrt(max(float(both[-1]) / count - float(mean.dot(mean)), 0.0))


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, p: Params
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """D-PSGD over the elastic group (module docstring); more than one worker.

    Promises: the model comes back as it is, with rank 0's parameters (a replacement:
    its neighbours' mean after its first round), and the optimizer as an
    :class:`ElasticGossip` around ``optimizer``."""
    weights = elastic_start.starting_weights(ctx, model)
    group = elastic_start.averager(ctx)
    assert weights is not None and group is not None
    opt = ElasticGossip(optimizer, weights, rank=ctx.rank, world_size=ctx.world_size, settings=p)
    opt.elastic = group
    # The members may form a generation one collective apart (their headers level them).
    elastic_start.begin(ctx, opt, group, "dpsgd", opt.joining_round, model=model, steps=int)
    return model, opt
