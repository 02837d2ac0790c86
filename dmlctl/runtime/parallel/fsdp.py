"""Sharded data parallelism: FSDP2's ``fully_shard`` on a model's blocks, then its root."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard


def shard_model(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """``fully_shard`` every direct child of ``model`` that holds parameters (one
    all-gather per block in the forward pass, one reduce-scatter in the backward),
    then ``model`` itself for the parameters left. ``mesh`` is the shard dimension,
    or (replicate, shard) for hybrid sharding (HSDP). Returns ``model``, whose
    parameters are now DTensors: build optimizers after this."""
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
