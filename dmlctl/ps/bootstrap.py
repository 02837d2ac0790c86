"""How workers and servers agree on what is served (runtime side, torch).

The servers never see the model: the first worker describes it — parameter shapes,
dtype, the size-balanced shard plan (:func:`dmlctl.ps.shards.plan_shards`) and the
server's configuration (update rule, staleness bound) — in a :class:`Layout`, and
sends it and the initial parameters to every rank with two broadcasts over the
default group. Workers take part too, so every worker starts from the first
worker's parameters, like DDP's initial broadcast. Both calls are collective: every
worker calls them from ``ctx.prepare``, every server before it serves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dmlctl.ps.server import pack


@dataclass(frozen=True)
class Layout:
    """What the servers serve and how (plain data; broadcast as a Python object)."""

    shapes: list[tuple[int, ...]]
    dtype: str  # e.g. "float32"
    plan: list[list[int]]  # plan[k]: tensor indices server k holds
    workers: list[int]  # global ranks
    servers: list[int]  # global ranks; servers[k] holds shard k
    rule: dict[str, Any] = field(default_factory=dict)  # see dmlctl.ps.serve.make_rule
    staleness_bound: int | None = None
    log_every_s: float = 1.0

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype)
        assert isinstance(dtype, torch.dtype)
        return dtype

    def shard_numel(self) -> list[int]:
        """Elements of each shard."""
        sizes = [math.prod(s) for s in self.shapes]
        return [sum(sizes[i] for i in shard) for shard in self.plan]

    def total_numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


def share_layout(layout: Layout | None, src: int) -> Layout:
    """``layout`` as global rank ``src`` has it, on every rank (collective)."""
    box: list[Any] = [layout]
    dist.broadcast_object_list(box, src=src)
    got = box[0]
    if not isinstance(got, Layout):
        raise RuntimeError(f"rank {src} sent no parameter-server layout")
    return got


def share_initial(
    layout: Layout, src: int, params: Sequence[torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """The initial flat shards ``pack(params, plan[k])`` as global rank ``src`` has them,
    on every rank (collective: one broadcast of all parameters). ``params`` is needed
    on ``src`` only."""
    if params is not None:
        flat = torch.cat([pack(params, shard) for shard in layout.plan]).contiguous()
    else:
        flat = torch.empty(layout.total_numel(), dtype=layout.torch_dtype)
    dist.broadcast(flat, src=src)
    out, offset = [], 0
    for n in layout.shard_numel():
        out.append(flat[offset : offset + n])
        offset += n
    return out
