"""D-PSGD: decentralized parallel SGD by gossip with neighbours (Lian et al., 2017).

Every worker holds its own model ``xᵢ``; there is no central copy and no global
collective in the training path. With a doubly stochastic mixing matrix ``W`` over a
topology (:mod:`dmlctl.strategies.topology`) the update is

    xᵢ ← Σⱼ Wᵢⱼ xⱼ − γ ∇fᵢ(xᵢ)

Order, as in the paper: the script computes the gradient at the current ``xᵢ``
(``loss.backward()``); ``optimizer.step()`` then first **mixes** the parameters with
the neighbours' (``xᵢ ← Σⱼ Wᵢⱼ xⱼ``) and then lets the user's optimizer apply that
gradient to the mixed parameters. For plain SGD this is exactly the update above;
with momentum or Adam the optimizer's update direction replaces ``γ ∇fᵢ``. Mixing
happens on steps ``period, 2·period, …`` (every step by default); the steps in
between are purely local.

Promises:

* **Point-to-point only.** A mixing round sends this worker's parameters as one
  flat buffer to each neighbour and receives one from each, through
  ``dist.batch_isend_irecv``, and waits on every work object (gloo's point-to-point
  work has no futures). ``comm_bytes_per_step`` counts the bytes sent:
  ``#neighbours × parameter bytes`` per mixing round.
* **Mean preserved.** ``W`` is doubly stochastic, so a mixing round leaves the mean
  of the workers' models unchanged (up to float rounding); on a connected graph
  repeated rounds shrink the consensus distance towards 0.
* **Same start.** :func:`prepare` broadcasts rank 0's parameters once (at wrap time,
  not in the training path), so all replicas start identical.
* **Monitoring.** Every ``consensus_every`` steps ``consensus`` =
  sqrt(meanᵢ ‖xᵢ − x̄‖²) is measured after the step (one all-reduce of the flat
  parameters plus a scalar all-reduce) and reported through ``ctx.log``. This is
  monitoring, not training traffic: neither its bytes nor its time are counted in
  ``comm_bytes_per_step`` / ``comm_share``. ``consensus_every: 0`` turns it off.
* Every worker must take the same number of optimizer steps (mixing rounds pair
  up point-to-point messages), as ``ctx.shard`` arranges.
* Only parameters are mixed; buffers (e.g. BatchNorm statistics) stay local until the
  final average, which covers those that change in training
  (:mod:`dmlctl.runtime.buffers`). The
  model must be on ``ctx.device`` and hold parameters of a single dtype.

The parameters are :mod:`dmlctl.strategies.dpsgd.params`'s; this module imports torch
(hosts only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from pydantic import BaseModel

from dmlctl.runtime import staged
from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.strategies import topology
from dmlctl.strategies.common import (
    assign_flat,
    average_in_place,
    consensus_distance,
    flat_params,
)
from dmlctl.strategies.dpsgd.params import Params
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


class DPSGDOptimizer(StrategyOptimizer):
    """The user's optimizer plus gossip mixing before the local step."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        rank: int,
        world_size: int,
        settings: Params,
    ) -> None:
        super().__init__(inner, params, world_size=world_size, period=settings.period)
        self.settings = settings
        self.weights = topology.neighbours(settings.topology, world_size, rank)
        self.rank = rank
        self.peers = [j for j in self.weights if j != rank]
        self.meter.extra["consensus"] = 0.0

    def before_step(self) -> None:
        # The step about to run is number local_steps + 1: mix first when it is due
        # (the gradient was computed at the pre-mixing parameters, as in the paper).
        if self.world_size > 1 and (self.local_steps + 1) % self.period == 0:
            self.mix()

    def communicate(self) -> None:
        """Nothing after the step: mixing happens in :meth:`before_step`."""

    def mix(self) -> None:
        """One gossip round: xᵢ ← Σⱼ Wᵢⱼ xⱼ with point-to-point messages only."""
        start = time.perf_counter()
        flat = flat_params(self.params)
        received = {j: torch.empty_like(flat) for j in self.peers}
        staged.exchange([(flat, j) for j in self.peers], [(received[j], j) for j in self.peers])
        mixed = flat * self.weights[self.rank]
        for j, buffer in received.items():
            mixed.add_(buffer, alpha=self.weights[j])
        assign_flat(self.params, mixed)
        self.check_finite(mixed, where="after gossip mixing", step=self.local_steps + 1)
        nbytes = len(self.peers) * flat.numel() * flat.element_size()
        self.meter.add(nbytes, time.perf_counter() - start)

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        loss = super().step(closure)
        every = self.settings.consensus_every
        if every and self.local_steps % every == 0:
            self.meter.extra["consensus"] = self.consensus()
        return loss

    def final_model(self) -> None:
        """Every worker ← the mean of all workers' parameters and the buffers exchanged
        (:mod:`dmlctl.runtime.buffers`; one all-reduce): the average D-PSGD's
        analysis is about."""
        tensors = [*self.params, *self.exchanged_buffers()]
        mean = average_in_place(tensors, self.meter, self.world_size)
        if mean is not None:
            self.check_finite(mean, tensors, "in the final average")

    def consensus(self) -> float:
        """sqrt(meanᵢ ‖xᵢ − x̄‖²) over all workers (collective; monitoring only)."""
        if self.world_size == 1:
            return 0.0
        mean = flat_params(self.params).to(torch.float64)
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        mean /= self.world_size
        return consensus_distance(self.params, mean, self.world_size)

    def shown_settings(self) -> dict[str, object]:
        """The topology, this worker's peers and the period."""
        shown = {"topology": repr(self.settings.topology), "peers": self.peers}
        return {**shown, **super().shown_settings()}


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Keep ``model`` as it is and wrap ``optimizer`` in D-PSGD's mixing optimizer.

    Promises: the model comes back unchanged (no wrapper; with more than one worker
    its parameters are first overwritten by rank 0's, one broadcast per tensor). The
    returned optimizer steps the user's optimizer and mixes with the topology's
    neighbours as the module docstring says; ``state_dict()`` holds the user's
    optimizer state and the step count. At world size 1 it only counts steps
    (no communication, ``consensus`` = 0).
    """
    p = params_as(Params, params)
    tensors = list(model.parameters())
    if ctx.world_size > 1:
        for tensor in tensors:
            dist.broadcast(tensor.data, src=0)
    wrapped = DPSGDOptimizer(
        optimizer, tensors, rank=ctx.rank, world_size=ctx.world_size, settings=p
    )
    return model, wrapped
