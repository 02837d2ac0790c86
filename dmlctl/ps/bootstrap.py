"""How workers and servers agree on what is served (runtime side, torch).

The servers never see the model: the first worker describes it — parameter shapes,
dtype, the size-balanced shard plan (:func:`dmlctl.ps.shards.plan_shards`) and the
server's configuration (update rule, staleness bound) — in a :class:`Layout`, and
sends it and the initial parameters to every rank with two broadcasts over the
default group. Workers take part too, so every worker starts from the first
worker's parameters, like DDP's initial broadcast. Both calls are collective: every
worker calls them from ``ctx.prepare`` (through :func:`join_as_worker`), every server
before it serves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dmlctl.ps.server import pack, unpack
from dmlctl.ps.shards import plan_shards
from dmlctl.runtime import rejoin

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


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
    push: dict[str, Any] | None = None  # the push filter (dmlctl.ps.codec.PushCodec), or None
    #: DistBelief (model parallelism inside each replica, :mod:`dmlctl.ps.parts`): the
    #: global tensor indices of each model-parallel part, the part and the server of
    #: each shard, and the global rank whose values start each part. Empty: one part
    #: (the whole model), shard ``k`` on ``servers[k]``, worker 0's values.
    parts: list[list[int]] = field(default_factory=list)
    shard_parts: list[int] = field(default_factory=list)
    shard_servers: list[int] = field(default_factory=list)
    part_sources: list[int] = field(default_factory=list)

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

    def shard_sizes(self) -> list[list[int]]:
        """Elements of each tensor of each shard, in the shard's order."""
        return [[math.prod(self.shapes[i]) for i in shard] for shard in self.plan]

    def server_of(self, shard: int) -> int:
        """The global rank of the server that holds ``shard``."""
        return self.shard_servers[shard] if self.shard_servers else self.servers[shard]

    def servers_by_shard(self) -> list[int]:
        """The server of every shard, in shard order."""
        return [self.server_of(k) for k in range(len(self.plan))]

    def shards_of_part(self, part: int) -> list[int]:
        """The shards a worker of model-parallel ``part`` pushes and pulls."""
        if not self.parts:
            return list(range(len(self.plan)))
        return [k for k, p in enumerate(self.shard_parts) if p == part]

    def tensors_of_part(self, part: int) -> list[int]:
        """The global indices of the tensors of ``part``, in the part's order."""
        return list(self.parts[part]) if self.parts else list(range(len(self.shapes)))


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
        # the servers' side of the broadcast is on the CPU (a GPU model: one copy)
        flat = torch.cat([pack(params, shard) for shard in layout.plan]).cpu().contiguous()
    else:
        flat = torch.empty(layout.total_numel(), dtype=layout.torch_dtype)
    dist.broadcast(flat, src=src)
    out, offset = [], 0
    for n in layout.shard_numel():
        out.append(flat[offset : offset + n])
        offset += n
    return out


def join_as_worker(
    ctx: Context,
    model: torch.nn.Module,
    *,
    rule: dict[str, Any],
    staleness_bound: int | None = None,
    push: dict[str, Any] | None = None,
) -> tuple[list[torch.nn.Parameter], Layout]:
    """Bootstrap this worker: plan the shards of ``model``'s trainable parameters over
    the run's servers, with the servers' update ``rule`` (see
    :func:`dmlctl.ps.serve.make_rule`), ``staleness_bound`` and the ``push`` filter
    (see :class:`~dmlctl.ps.codec.PushCodec`), and take the first
    worker's layout and parameters (collective with every rank, servers included).

    Returns the parameters (now the first worker's) and the layout in force, for a
    :class:`~dmlctl.ps.worker.PSOptimizer`. Raises RuntimeError in a run without
    servers or when the parameters do not share one dtype."""
    members = ctx.membership
    if members is None:
        raise RuntimeError(
            f"strategy {ctx.strategy!r} needs parameter servers: set 'parameter_servers' "
            "in the job (and launch it with dmlctl)"
        )
    params = [p for p in model.parameters() if p.requires_grad]
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        found = ", ".join(sorted(map(str, dtypes)))
        raise RuntimeError(f"parameter servers need one parameter dtype, got {found}")
    layout = Layout(
        shapes=[tuple(p.shape) for p in params],
        dtype=str(params[0].dtype).removeprefix("torch."),
        plan=plan_shards([p.numel() for p in params], len(members.servers)),
        workers=list(members.workers),
        servers=list(members.servers),
        rule=rule,
        staleness_bound=staleness_bound,
        push=push,
    )
    return params, start_worker(ctx, params, layout)


def start_worker(ctx: Context, params: Sequence[torch.nn.Parameter], layout: Layout) -> Layout:
    """Bootstrap on a worker: the first worker's ``layout`` and parameters go to every
    rank (collective); this worker's ``params`` are overwritten with the first
    worker's. Returns the layout in force."""
    members = ctx.membership
    assert members is not None
    if rejoin.rejoining():
        return _rejoin(ctx, params)
    src = members.workers[0]
    first = ctx.global_rank == src
    layout = share_layout(layout if first else None, src=src)
    if first and rejoin.in_place():
        rejoin.publish_object(LAYOUT_KEY, layout)  # for a worker started again in place
    _check_shapes(ctx, params, layout)
    shards = share_initial(layout, src=src, params=list(params) if first else None)
    fresh = unpack(shards, layout.plan, [torch.Size(s) for s in layout.shapes])
    with torch.no_grad():
        for p, value in zip(params, fresh, strict=True):
            p.copy_(value)
    return layout


LAYOUT_KEY = "ps-layout"
"""The store key of the layout, for a worker or server started again in place."""


def _check_shapes(ctx: Context, params: Sequence[torch.nn.Parameter], layout: Layout) -> None:
    if [tuple(p.shape) for p in params] != [tuple(s) for s in layout.shapes]:
        raise RuntimeError(
            f"worker {ctx.rank}: the model's parameter shapes differ from worker 0's "
            "(every worker must build the same model)"
        )


def _rejoin(ctx: Context, params: Sequence[torch.nn.Parameter]) -> Layout:
    """A worker started again in place (:mod:`dmlctl.runtime.rejoin`): the layout the
    first worker kept in the store (no collective). The servers' current model comes
    with the worker's first pull (:class:`~dmlctl.ps.worker.PSOptimizer`)."""
    layout: Layout = rejoin.read_object(LAYOUT_KEY)
    _check_shapes(ctx, params, layout)
    return layout
