"""Stale synchronous parallel on parameter servers (Ho et al., NIPS 2013).

Like :mod:`dmlctl.strategies.asgd` with a push and a pull every step, plus a bound on
how far apart the workers may drift: a worker's **clock** is the number of steps it
has taken, and a worker at clock ``c`` waits in its pull until every worker still
training has reached clock ``c − s``. So every read sees every worker's first
``c − s`` updates, and no worker runs more than ``s`` clocks ahead of the slowest.

* ``s = 0`` is synchronous training: each read waits for every worker's update of
  the previous clock, and rides on the worker's own push (one message), so no
  worker's next update can slip in between. With plain SGD (or momentum SGD) and the
  default ``scale = 1/p`` the parameters then follow synchronous SGD with averaged
  gradients (``ssgd``) up to floating-point rounding.
* a large ``s`` never waits: ``asgd``.

The servers report ``clock_spread`` (fastest − slowest worker) and ``max_lead`` (the
largest ``c − min_clock`` of any answered read, never above ``s``); each worker
reports its ``clock`` and the ``min_clock`` its last read saw.
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
    """``strategy.params`` of an ``ssp`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    staleness: int = Field(
        default=3,
        ge=0,
        le=MAX_PERIOD,
        description="s: the most clocks a worker may be ahead of the slowest one "
        "(0: synchronous).",
    )
    scale: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WEIGHT,
        description="Weight the servers give a pushed change; default 1/workers.",
    )


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers and wrap ``optimizer`` (collective with the servers)."""
    p = params_as(Params, params)
    rule = ps_common.delta_rule(p.scale, ctx.world_size)
    return ps_common.prepare_worker(
        ctx, model, optimizer, rule=rule, mode="delta",
        staleness_bound=p.staleness, n_push=1, n_fetch=1,
    )  # fmt: skip
