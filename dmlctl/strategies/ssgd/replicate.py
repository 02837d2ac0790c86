"""Synchronous SGD across the replicate dimension of a device mesh (runtime side, torch).

With a ``parallelism:`` block each data-parallel replica may span several ranks
(tensor-parallel peers, pipeline stages); the ranks holding the same part of the
model in different replicas form a group of the mesh's ``dp_replicate`` dimension.
:class:`ReplicatedGrads` averages every gradient over that group before each step —
one all-reduce of all this rank's gradients (local shards for DTensors), flattened
into one buffer — so the replicas stay identical, exactly as DDP keeps whole
replicas identical. (With ``data_parallel_shard_degree`` > 1, FSDP2's hybrid
sharding does this itself.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from dmlctl.runtime.optimizer import StrategyOptimizer


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard, else ``t`` itself."""
    return t._local_tensor if isinstance(t, DTensor) else t


class ReplicatedGrads(StrategyOptimizer):
    """The user's optimizer, with each gradient averaged over ``group`` first."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        world_size: int,
        group: dist.ProcessGroup,
    ) -> None:
        super().__init__(inner, params, world_size=world_size)
        self.group = group
        self.replicas = dist.get_world_size(group)
        src = dist.get_global_rank(group, 0)
        with torch.no_grad():  # every replica starts from the first one's parameters
            for p in self.params:
                dist.broadcast(local(p), src=src, group=group)

    def before_step(self) -> None:
        """Average the gradients over the replicas (one all-reduce)."""
        grads = [local(p.grad) for p in self.params if p.grad is not None]
        if not grads:
            return
        began = time.perf_counter()
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        flat /= self.replicas
        for g, mean in zip(grads, torch.split(flat, [g.numel() for g in grads]), strict=True):
            g.copy_(mean.view_as(g))
        self.meter.add(flat.numel() * flat.element_size(), time.perf_counter() - began)

    def communicate(self) -> None:
        """Nothing after the step: the gradients were averaged before it."""
