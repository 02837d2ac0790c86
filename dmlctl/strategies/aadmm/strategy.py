"""Asynchronous consensus ADMM on parameter servers (Zhang & Kwok, "Asynchronous
distributed ADMM for consensus optimization", ICML 2014).

Consensus ADMM (:mod:`dmlctl.strategies.admm`) solves ``min Σₖ fₖ(wₖ)`` subject to
``wₖ = z`` with a barrier every round. Here ``z`` lives on the parameter servers and
the barrier is partial. Worker ``k``, with dual ``λₖ`` (kept scaled, ``uₖ = λₖ/ρ``):

1. takes ``local_steps`` steps of the user's optimizer on
   ``fₖ(w) + λₖᵀ(w − z) + ρ/2 ‖w − z‖²`` (the penalty's gradient ``ρ(w − z + uₖ)``
   is added to the gradients before each step);
2. pushes ``vₖ = wₖ + λₖ/ρ`` and waits for the update of ``z`` that includes it;
3. updates its dual ``λₖ ← λₖ + ρ(wₖ − z)`` with the new ``z`` and goes on.

A server keeps every worker's latest ``vₖ`` (``z₀`` for one that has not reported)
and updates ``z ← mean_k vₖ`` as soon as at least ``K₀ = min_workers`` workers
reported since the last update *and* no worker that has not reported has missed
``τ = max_delay`` updates already: a worker whose delay reached ``τ`` is waited for,
so no delay exceeds ``τ``. The servers report ``delay_max`` (the largest delay
ever) and ``delay_now``; every worker its ``primal_res`` ``‖wₖ − z‖``.

With ``K₀ = K`` every update waits for every worker: the z sequence of synchronous
``admm`` with ``init: broadcast``. ρ defaults from the optimizer as for ``admm``; at
the end every worker takes ``z`` (``final: local`` keeps each ``wₖ``). Pushes carry
parameters, not changes, so ``push_compression`` (error feedback on a change) does
not apply here.

The parameters are :mod:`dmlctl.strategies.aadmm.params`'s; this module imports
torch (hosts only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel

from dmlctl.ps.bootstrap import join_as_worker
from dmlctl.ps.serve import serve
from dmlctl.ps.worker import Wiring
from dmlctl.strategies import optimizers
from dmlctl.strategies.aadmm.mode import ConsensusExchange
from dmlctl.strategies.aadmm.params import Params, check_world, resolve_min_workers
from dmlctl.strategies.admm.params import derive_rho
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

__all__ = ["prepare", "serve"]


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers (z starts at the first worker's parameters, which every
    worker takes) and wrap ``optimizer`` (collective with the servers). Raises
    ValueError when ρ cannot be derived or K₀ exceeds the workers."""
    p = params_as(Params, params)
    problem = check_world(p, ctx.world_size)
    if problem is not None:
        raise ValueError(f"aadmm: {problem}")
    rho = derive_rho(
        p.rho,
        optimizers.family(optimizer),
        optimizers.effective_lr(optimizer),
        "aadmm",
        p.local_steps,
    )
    rule = {
        "kind": "consensus",
        "min_workers": resolve_min_workers(p, ctx.world_size),
        "max_delay": p.max_delay,
    }
    weights, layout = join_as_worker(ctx, model, rule=rule)
    wiring = Wiring(ctx, layout, overlap=p.overlap)
    opt = ConsensusExchange(optimizer, weights, wiring, rho=rho, local_steps=p.local_steps)
    return model, opt
