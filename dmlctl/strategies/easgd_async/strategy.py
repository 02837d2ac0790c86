"""Asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun, NeurIPS 2015, Alg. 1).

The *center* variable ``x̃`` lives on the parameter servers. Every worker ``i`` takes
local steps with the user's optimizer; every ``τ = period`` steps it pulls ``x̃``,
computes the elastic difference ``e = α (xᵢ − x̃)``, moves ``xᵢ ← xᵢ − e`` and pushes
``e``, which the server adds to the center (``x̃ ← x̃ + e``) when it arrives — no
worker waits for another. ``α`` defaults to ``β / p`` (``β = 0.9``), as in
:mod:`dmlctl.strategies.easgd`. At the end of the data every worker takes the
center, so the trained model is ``x̃``.

The parameters are :mod:`dmlctl.strategies.easgd_async.params`'s; this module imports
torch (hosts only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel

from dmlctl.ps.bootstrap import join_as_worker
from dmlctl.ps.serve import serve
from dmlctl.ps.worker import Wiring
from dmlctl.strategies.easgd.params import resolve_alpha
from dmlctl.strategies.easgd_async.mode import ElasticExchange
from dmlctl.strategies.easgd_async.params import Params
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

__all__ = ["prepare", "serve"]


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers (the center starts at the first worker's parameters) and
    wrap ``optimizer`` (collective with the servers)."""
    p = params_as(Params, params)
    alpha = resolve_alpha(p, ctx.world_size)
    rule = {"kind": "scaled_add", "alpha": 1.0}  # the workers send α(x − x̃) already
    weights, layout = join_as_worker(ctx, model, rule=rule, push=p.push_spec())
    wiring = Wiring(ctx, layout, overlap=p.overlap)
    opt = ElasticExchange(optimizer, weights, wiring, period=p.period, alpha=alpha)
    return model, opt
