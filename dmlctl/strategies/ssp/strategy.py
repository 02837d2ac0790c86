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

The parameters are :mod:`dmlctl.strategies.ssp.params`'s; this module imports torch
(hosts only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel

from dmlctl.ps.serve import serve
from dmlctl.strategies.asgd.strategy import delta_push
from dmlctl.strategies.registry import params_as
from dmlctl.strategies.ssp.params import Params

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

__all__ = ["prepare", "serve"]


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """asgd's worker (:func:`~dmlctl.strategies.asgd.strategy.delta_push`, collective
    with the servers) pushing and pulling every step, its pulls answered once it is
    at most ``staleness`` clocks ahead of the slowest worker."""
    p = params_as(Params, params)
    opt = delta_push(ctx, model, optimizer, p.scale, p.push_spec(), staleness_bound=p.staleness)
    return model, opt
