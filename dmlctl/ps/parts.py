"""DistBelief: model parallelism inside each replica, asynchronous data parallelism
across replicas through parameter servers (runtime side, torch).

Dean et al. (2012) split each model replica over several machines and trained the
replicas asynchronously through sharded parameter servers. Here a replica is split
by the job's ``parallelism:`` block (tensor and/or pipeline degree > 1) and the
replicas are the mesh's ``dp_replicate`` groups. Each model-parallel *part* — a
(pipeline stage, tensor-parallel slice) coordinate — has tensors of its own: its
shards of the split layers (a DTensor's local tensor) and, on the first
tensor-parallel rank only, the tensors every tensor-parallel rank holds whole
(norms, embeddings, a row-wise layer's bias). The servers hold every part's tensors
in shards that never mix parts, and a worker pushes and pulls only its part's
shards: the replicas' ranks of one part train that part asynchronously, each shard's
staleness counted by its server. After a pull, the first tensor-parallel rank hands
the whole tensors to its peers (one broadcast in the tensor-parallel group), so a
replica's ranks always compute with the same copy.

Bootstrap (collective over every rank, servers included): the parts' shapes are
gathered from the workers, the first worker plans the shards and broadcasts the
layout, then each part's first worker broadcasts its part's starting values (every
replica of a part starts from them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from dmlctl.ps.bootstrap import Layout, share_layout
from dmlctl.ps.server import pack, unpack
from dmlctl.ps.shards import plan_shards

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def plan_parts(
    part_sizes: Sequence[Sequence[int]], n_servers: int
) -> tuple[list[list[int]], list[int], list[int], list[list[int]]]:
    """Shards of every part's tensors over ``n_servers`` servers, never mixing parts:
    ``(plan, shard_parts, shard_servers, parts)`` with global tensor indices (part
    ``p``'s tensors numbered after part ``p - 1``'s), the part and the server index
    of each shard, and each part's tensor indices. With at least as many servers as
    parts, part ``p`` is spread size-balanced over servers ``p, p + P, …``; with
    fewer, part ``p`` goes whole to server ``p mod n_servers``."""
    plan: list[list[int]] = []
    shard_parts: list[int] = []
    shard_servers: list[int] = []
    parts: list[list[int]] = []
    offset = 0
    n_parts = len(part_sizes)
    for p, sizes in enumerate(part_sizes):
        parts.append(list(range(offset, offset + len(sizes))))
        servers = list(range(p, n_servers, n_parts)) or [p % n_servers]
        for k, shard in enumerate(plan_shards(sizes, len(servers))):
            plan.append([offset + i for i in shard])
            shard_parts.append(p)
            shard_servers.append(servers[k])
        offset += len(sizes)
    return plan, shard_parts, shard_servers, parts


def is_split(p: torch.Tensor) -> bool:
    """Whether ``p`` is a DTensor sharded over some mesh dimension."""
    return isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements)


def local(p: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds of ``p`` (a DTensor's local tensor)."""
    return p._local_tensor if isinstance(p, DTensor) else p


def own_tensors(model: nn.Module, tp_rank: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(the tensors this rank's part pushes and pulls, the tensors every
    tensor-parallel rank holds whole): its local shards of split parameters, plus on
    tensor-parallel rank 0 the whole ones (the others take them from it)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    whole = [local(p) for p in trained if not is_split(p)]
    mine = [local(p) for p in trained if is_split(p) or tp_rank == 0]
    return mine, whole


def join_as_part(
    ctx: Context,
    tensors: Sequence[torch.Tensor],
    part: int,
    n_parts: int,
    *,
    rule: dict[str, Any],
    push: dict[str, Any] | None = None,
) -> Layout:
    """Bootstrap this worker of model-parallel ``part`` (module docstring; collective
    with every rank). ``tensors`` are its part's tensors; they end with the part's
    starting values. Returns the layout in force."""
    members = ctx.membership
    assert members is not None
    shapes, dtype, sources = _describe_parts(members.workers, members.group, tensors, part, n_parts)
    plan, shard_parts, shard_servers, parts = plan_parts(
        [[math.prod(s) for s in part_shapes] for part_shapes in shapes], len(members.servers)
    )
    layout = Layout(
        shapes=[s for part_shapes in shapes for s in part_shapes],
        dtype=dtype,
        plan=plan,
        workers=list(members.workers),
        servers=list(members.servers),
        rule=rule,
        push=push,
        parts=parts,
        shard_parts=shard_parts,
        shard_servers=[members.servers[k] for k in shard_servers],
        part_sources=sources,
    )
    first = ctx.global_rank == members.workers[0]
    layout = share_layout(layout if first else None, src=members.workers[0])
    flats = share_initial_parts(layout, tensors, ctx.global_rank)
    shards = layout.shards_of_part(part)
    where = {g: i for i, g in enumerate(layout.parts[part])}
    fresh = unpack(
        [flats[k] for k in shards],
        [[where[i] for i in layout.plan[k]] for k in shards],
        [torch.Size(layout.shapes[i]) for i in layout.parts[part]],
    )
    with torch.no_grad():
        for t, value in zip(tensors, fresh, strict=True):
            t.copy_(value)
    return layout


def _describe_parts(
    workers: Sequence[int],
    group: Any,
    tensors: Sequence[torch.Tensor],
    part: int,
    n_parts: int,
) -> tuple[list[list[tuple[int, ...]]], str, list[int]]:
    """(every part's tensor shapes, their dtype, each part's first worker), gathered
    from the workers (collective over their group). Raises RuntimeError when a part
    has no worker or the parts disagree on the dtype."""
    mine = (part, [tuple(t.shape) for t in tensors], str(tensors[0].dtype).removeprefix("torch."))
    seen: list[Any] = [None] * len(workers)
    dist.all_gather_object(seen, mine, group=group)
    described: dict[int, tuple[list[tuple[int, ...]], str, int]] = {}
    for worker, (p, shapes, dtype) in zip(workers, seen, strict=True):
        described.setdefault(p, (shapes, dtype, worker))
    dtypes = {d for _, d, _ in described.values()}
    if sorted(described) != list(range(n_parts)) or len(dtypes) != 1:
        raise RuntimeError(
            f"DistBelief needs workers for all {n_parts} model-parallel parts, with one "
            f"parameter dtype; found parts {sorted(described)}, dtypes {sorted(dtypes)}"
        )
    shapes = [described[p][0] for p in range(n_parts)]
    return shapes, dtypes.pop(), [described[p][2] for p in range(n_parts)]


def share_initial_parts(
    layout: Layout, tensors: Sequence[torch.Tensor] | None, rank: int
) -> dict[int, torch.Tensor]:
    """Every shard's starting values (shard → flat), each part's broadcast by its
    source (collective over the default group: one broadcast per part). The source
    of a part passes that part's ``tensors``; other ranks may pass None."""
    out: dict[int, torch.Tensor] = {}
    for p, src in enumerate(layout.part_sources):
        shards = layout.shards_of_part(p)
        numel = [layout.shard_numel()[k] for k in shards]
        if rank == src and tensors is not None:
            where = {g: i for i, g in enumerate(layout.parts[p])}
            packed = [pack(tensors, [where[i] for i in layout.plan[k]]) for k in shards]
            flat = torch.cat(packed).cpu()  # the servers receive on the CPU
        else:
            flat = torch.empty(sum(numel), dtype=layout.torch_dtype)
        dist.broadcast(flat.contiguous(), src=src)
        offset = 0
        for k, n in zip(shards, numel, strict=True):
            out[k] = flat[offset : offset + n]
            offset += n
    return out


class WholeTensorSync:
    """After a pull, the first tensor-parallel rank of a replica hands its whole
    tensors (pulled) to its peers, which do not pull them (one broadcast each, in
    the tensor-parallel group)."""

    def __init__(self, tensors: Sequence[torch.Tensor], group: dist.ProcessGroup) -> None:
        self.tensors, self.group = list(tensors), group
        self.src = dist.get_global_rank(group, 0)

    def __call__(self) -> None:
        with torch.no_grad():
            for t in self.tensors:
                dist.broadcast(t, src=self.src, group=self.group)
