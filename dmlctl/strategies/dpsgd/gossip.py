"""D-PSGD's optimizer: the user's optimizer plus point-to-point gossip mixing before
the local step (the update rule and promises are in
:mod:`dmlctl.strategies.dpsgd.strategy`'s docstring)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

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
