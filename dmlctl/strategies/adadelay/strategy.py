"""AdaDelay: asynchronous SGD with a delay-adaptive step (Sra et al., AISTATS 2016).

Workers push their gradients every step (the user's optimizer does *not* step: the
servers do) and pull every ``n_fetch`` steps. A server applies the gradient ``g`` that
arrives as its shard's ``t``-th update with measured delay ``τ`` as
``x_j ← x_j − α_j(t, τ) g_j`` with

    α_j(t, τ) = 1 / (L + c_j(t) · √(t + τ)),
    c_j(t)    = c · √( (1/t) Σ_{k≤t} (τ_k + 1) g_{k,j}² )

(see :class:`dmlctl.ps.rules.AdaDelay`): the step shrinks with the delay the update
actually had, not with a worst-case bound, and with the delay-weighted size of the
coordinate's past gradients. The user's optimizer is replaced (a notice says so at
start); ``L`` defaults from it (:func:`~dmlctl.strategies.adadelay.params.resolve_l`):
``1/lr`` for plain SGD, ``√(1 − μ)/lr`` with momentum μ (the largest step between
the optimizer's ``lr`` and its steady-state step ``lr/(1 − μ)``), ``1/(100·lr)`` for
Adam and the adaptive family. The
servers report
``step_size`` (mean α of the latest update) and the staleness median / max.

The parameters are :mod:`dmlctl.strategies.adadelay.params`'s; this module imports torch
(hosts only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel

from dmlctl.ps.bootstrap import join_as_worker
from dmlctl.ps.modes import GradientPush
from dmlctl.ps.serve import serve
from dmlctl.ps.worker import Wiring
from dmlctl.strategies import optimizers
from dmlctl.strategies.adadelay.params import Params, resolve_l
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

__all__ = ["prepare", "serve"]


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers and wrap ``optimizer`` (collective with the servers);
    says once that the optimizer is replaced. Raises ValueError when ``L`` is not
    given and cannot be derived from the optimizer."""
    p = params_as(Params, params)
    big_l = resolve_l(
        p,
        optimizers.family(optimizer),
        optimizers.first_lr(optimizer),
        optimizers.effective_lr(optimizer),
    )
    ctx.notice(
        f"adadelay replaces {optimizers.describe(optimizer)} with its own SGD step "
        f"1/(L + c·…) on the parameter servers, L = {big_l:g}"
        + ("" if p.L is not None else " (derived from it; set strategy.params.L to choose)")
    )
    rule = {"kind": "adadelay", "L": big_l, "c": p.c}
    weights, layout = join_as_worker(ctx, model, rule=rule, push=p.push_spec())
    advice = (
        f"raise L (L={big_l:g}: the servers' largest step is 1/L; the optimizer's lr is not used)"
    )
    opt = GradientPush(optimizer, weights, Wiring(ctx, layout), n_fetch=p.n_fetch, advice=advice)
    return model, opt
