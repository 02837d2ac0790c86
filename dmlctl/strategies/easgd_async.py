"""Asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun, NeurIPS 2015, Alg. 1).

The *center* variable ``x̃`` lives on the parameter servers. Every worker ``i`` takes
local steps with the user's optimizer; every ``τ = period`` steps it pulls ``x̃``,
computes the elastic difference ``e = α (xᵢ − x̃)``, moves ``xᵢ ← xᵢ − e`` and pushes
``e``, which the server adds to the center (``x̃ ← x̃ + e``) when it arrives — no
worker waits for another. ``α`` defaults to ``β / p`` (``β = 0.9``), as in
:mod:`dmlctl.strategies.easgd`. At the end of the data every worker takes the
center, so the trained model is ``x̃``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from dmlctl.strategies import ps_common
from dmlctl.strategies.params import MAX_PERIOD, PARAMS_CONFIG
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    import torch

    from dmlctl.runtime.context import Context

ROLES = ps_common.ROLES
serve = ps_common.serve


class Params(BaseModel):
    """``strategy.params`` of an ``easgd-async`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    period: int = Field(
        le=MAX_PERIOD,
        default=4, ge=1, description="τ: local steps between two exchanges with the center."
    )
    beta: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="β = pα; used when alpha is not given.",
    )
    alpha: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="α, the elastic moving rate of one exchange; default β/p.",
    )


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers (the center starts at the first worker's parameters) and
    wrap ``optimizer`` (collective with the servers)."""
    p = params_as(Params, params)
    alpha = p.alpha if p.alpha is not None else p.beta / ctx.world_size
    return ps_common.prepare_worker(
        ctx, model, optimizer, rule={"kind": "scaled_add", "alpha": 1.0}, mode="elastic",
        period=p.period, elastic_alpha=alpha,
    )  # fmt: skip
