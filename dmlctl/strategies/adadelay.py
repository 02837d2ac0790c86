"""AdaDelay: asynchronous SGD with a delay-adaptive step (Sra et al., AISTATS 2016).

Workers push their gradients every step (the user's optimizer does *not* step: the
servers do) and pull every ``n_fetch`` steps. A server applies the gradient ``g`` that
arrives as its shard's ``t``-th update with measured delay ``τ`` as
``x_j ← x_j − α_j(t, τ) g_j`` with

    α_j(t, τ) = 1 / (L + c_j(t) · √(t + τ)),
    c_j(t)    = c · √( (1/t) Σ_{k≤t} (τ_k + 1) g_{k,j}² )

(see :class:`dmlctl.ps.rules.AdaDelay`): the step shrinks with the delay the update
actually had, not with a worst-case bound, and with the delay-weighted size of the
coordinate's past gradients. ``L`` defaults to ``1 / lr`` of the user's optimizer, so
the first, undelayed step is at most the optimizer's own ``lr``. The servers report
``step_size`` (mean α of the latest update) and the staleness median / max.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from dmlctl.strategies import ps_common
from dmlctl.strategies.params import MAX_PERIOD, MAX_WEIGHT, PARAMS_CONFIG
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    import torch

    from dmlctl.runtime.context import Context

ROLES = ps_common.ROLES
serve = ps_common.serve


class Params(BaseModel):
    """``strategy.params`` of an ``adadelay`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    n_fetch: int = Field(
        le=MAX_PERIOD,
        default=1, ge=1, description="Pull fresh parameters from the servers every n_fetch steps."
    )
    L: float | None = Field(
        default=None,
        gt=0,
        le=1e12,
        description="L, the smoothness constant: the largest step is 1/L; default "
        "1/lr of the optimizer.",
    )
    c: float = Field(
        default=0.1,
        ge=0,
        le=MAX_WEIGHT,
        description="Scale of the adaptive, delay-weighted term c_j (0: constant step 1/L).",
    )


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers and wrap ``optimizer`` (collective with the servers).
    Raises ValueError when ``L`` is not given and the optimizer's lr is not positive."""
    p = params_as(Params, params)
    lr = ps_common.first_lr(optimizer)
    if p.L is None and not lr > 0:
        raise ValueError(f"adadelay: L defaults to 1/lr, but the optimizer's lr is {lr}; set L")
    big_l = p.L if p.L is not None else 1.0 / lr
    return ps_common.prepare_worker(
        ctx, model, optimizer, rule={"kind": "adadelay", "L": big_l, "c": p.c}, mode="gradient",
        n_fetch=p.n_fetch,
    )  # fmt: skip
