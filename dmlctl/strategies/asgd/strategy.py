"""Asynchronous SGD on parameter servers (Downpour SGD, Dean et al., NIPS 2012).

Each worker trains on its own batches with the user's optimizer and talks to the
servers without waiting for the other workers: every ``n_push`` steps it pushes the
change of its parameters since its last push (with plain SGD and ``n_push = 1`` that
is ``-lr·g``, the gradient push), every ``n_fetch`` steps it pulls the servers'
parameters and continues from them plus what it has not pushed yet. A server adds
every delta the moment it arrives, multiplied by ``scale`` (default ``1/p`` for
``p`` workers, so ``p`` deltas move the model as far as one synchronous step of the
averaged gradient; ``scale: 1`` is Downpour's sum). The staleness of every applied
update — updates the shard got between the pushing worker's last pull and its push —
is measured and reported (median / max on the server's dashboard row).

Parameters are sharded over the job's ``parameter_servers`` (size-balanced); server
state (parameters, versions, clocks) is part of checkpoints. See
:mod:`dmlctl.ps.modes` (``DeltaPush``) for the worker's step and
:mod:`dmlctl.ps.worker` for the end of training.

The parameters are :mod:`dmlctl.strategies.asgd.params`'s; this module imports torch
(hosts only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from pydantic import BaseModel

from dmlctl.ps.bootstrap import join_as_worker
from dmlctl.ps.modes import DeltaPush
from dmlctl.ps.serve import serve
from dmlctl.ps.worker import Wiring
from dmlctl.strategies.asgd.params import Params
from dmlctl.strategies.common import delta_rule
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

__all__ = ["delta_push", "prepare", "serve"]


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers and wrap ``optimizer`` (collective with the servers)."""
    p = params_as(Params, params)
    if ctx.layout is not None and ctx.layout.model_parallel and ctx.mesh is not None:
        return model, _distbelief(ctx, model, optimizer, p)
    opt = delta_push(
        ctx,
        model,
        optimizer,
        p.scale,
        p.push_spec(),
        n_push=p.n_push,
        n_fetch=p.n_fetch,
        overlap=p.overlap,
    )
    return model, opt


def delta_push(
    ctx: Context,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scale: float | None,
    push: dict[str, Any] | None,
    *,
    n_push: int = 1,
    n_fetch: int = 1,
    overlap: bool = False,
    staleness_bound: int | None = None,
) -> DeltaPush:
    """Join the servers (collective with them) with the delta rule, a pushed change
    weighing ``scale`` (None: 1/workers), the ``push`` filter and ``staleness_bound``
    (ssp's s; None: none), and wrap ``optimizer`` in a :class:`DeltaPush` that
    pushes every ``n_push`` and pulls every ``n_fetch`` steps: asgd's worker, and
    ssp's with a push and a pull every step."""
    rule = delta_rule(scale, ctx.world_size)
    weights, layout = join_as_worker(
        ctx, model, rule=rule, staleness_bound=staleness_bound, push=push
    )
    wiring = Wiring(ctx, layout, overlap=overlap)
    return DeltaPush(optimizer, weights, wiring, n_push=n_push, n_fetch=n_fetch)


def _distbelief(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, p: Params
) -> DeltaPush:
    """asgd across the replicas of a model split by the job's ``parallelism:`` block
    (DistBelief, :mod:`dmlctl.ps.parts`): this worker pushes and pulls its own part's
    shards; a pushed change weighs ``scale``, default 1/replicas."""
    from dmlctl.ps.parts import WholeTensorSync, join_as_part, own_tensors  # DTensor

    mesh_layout, mesh = ctx.layout, ctx.mesh
    assert mesh_layout is not None and mesh is not None
    c = mesh_layout.coords(ctx.rank)
    part = c["pp"] * mesh_layout.tp + c["tp"]
    mine, whole = own_tensors(model, c["tp"])
    rule = delta_rule(p.scale, mesh_layout.dp_replicate)
    layout = join_as_part(
        ctx, mine, part, mesh_layout.pp * mesh_layout.tp, rule=rule, push=p.push_spec()
    )
    wiring = Wiring(ctx, layout, overlap=p.overlap, part=part)
    weights = cast("list[torch.nn.Parameter]", mine)
    opt = DeltaPush(optimizer, weights, wiring, n_push=p.n_push, n_fetch=p.n_fetch)
    if mesh_layout.tp > 1 and whole:
        opt.after_adopt = WholeTensorSync(whole, mesh.get_group("tp"))
    return opt
