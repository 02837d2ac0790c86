"""Consensus ADMM (Boyd, Parikh, Chu, Peleato & Eckstein 2011, §7.1).

Solves ``min Σᵢ fᵢ(x)`` with worker ``i`` owning ``fᵢ`` (its shard of the data) as
``min Σᵢ fᵢ(xᵢ)`` subject to ``xᵢ = z``. With ``ρ`` the penalty, ``uᵢ`` the scaled
dual variable of worker ``i`` and ``p`` workers, one round is:

* x-update, on every worker::

      xᵢ ← argmin_x  fᵢ(x) + ρ/2 ‖x − z + uᵢ‖²

  approximated by ``local_steps`` (``k``) steps of the user's optimizer, warm-started
  at the current ``xᵢ``: :meth:`before_step` adds the penalty's gradient
  ``ρ (x − z + uᵢ)`` to the gradients, so it goes through the optimizer (momentum,
  Adam's normalisation) like the loss's gradient does.
* z-update (one all-reduce of the parameters' size)::

      z ← mean_i (xᵢ + uᵢ)

* u-update, local::

      uᵢ ← uᵢ + xᵢ − z

Reported in ``meter.extra`` after each round: the primal residual
``‖r‖ = sqrt(Σᵢ ‖xᵢ − z‖²)`` (one scalar all-reduce, counted in the meter) as
``primal_res`` and the dual residual ``‖s‖ = ρ sqrt(p) ‖z − z_prev‖`` as ``dual_res``.

Deviations from §7.1, both standard for training: the x-update is inexact (k
optimizer steps, not the exact minimiser) and stochastic (minibatches of ``fᵢ``).
Workers train ``xᵢ``, not ``z``, until the end of training: the residuals say how far
apart they are.

``ρ`` defaults from the optimizer
(:func:`~dmlctl.strategies.admm.params.resolve_rho`); ``local_steps`` is 10 for every
optimizer (it sets how often the workers agree, not a step size). At the end of
training (:meth:`finish`) a last round folds in the steps since the previous one and
every worker takes ``z`` (``final: local`` keeps each ``xᵢ``).

``init: average`` starts ``z`` at the mean of the workers' initial models (they keep
their own ``xᵢ``); ``init: broadcast`` copies rank 0's model to every worker and starts
``z`` there. ``uᵢ`` starts at 0. State: ``z`` and ``uᵢ`` (:meth:`strategy_state`);
``uᵢ`` is this worker's own, so a checkpoint must keep every rank's optimizer state.

The parameters are :mod:`dmlctl.strategies.admm.params`'s; this module imports torch
(hosts only).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from pydantic import BaseModel

from dmlctl.runtime import rejoin
from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.strategies import elastic_start, optimizers
from dmlctl.strategies.admm.params import Params, resolve_rho
from dmlctl.strategies.common import add_to_grads, assign_flat, average_in_place, flat_params
from dmlctl.strategies.elastic import ElasticAverager
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


class ADMMOptimizer(StrategyOptimizer):
    """The user's optimizer on fᵢ + ρ/2‖x − z + uᵢ‖², plus z and u updates."""

    coupling: ClassVar[dict[str, str]] = {"rho": "rho"}

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        world_size: int,
        rho: float,
        local_steps: int,
        init: str,
        elastic: ElasticAverager | None = None,
    ) -> None:
        super().__init__(inner, params, world_size=world_size, period=local_steps)
        self.rho = rho
        #: ``restart.mode: in_place``: rounds over groups that outlive a lost worker
        #: (:mod:`dmlctl.strategies.elastic`); a replacement takes z there.
        self.elastic = elastic
        x = flat_params(self.params)
        self.z: torch.Tensor = x  # a replacement's, until its first round brings z
        if elastic is not None and rejoin.rejoining():
            pass
        elif init == "broadcast":
            dist.broadcast(x, src=0)
            assign_flat(self.params, x)
        else:
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            self.z = x / world_size
        self.u: torch.Tensor = torch.zeros_like(self.z)
        self._round_at = 0  # local_steps at the latest round

    def before_step(self) -> None:
        """Add the penalty's gradient ρ (x − z + uᵢ) to the gradients."""
        add_to_grads(self.params, flat_params(self.params) - self.z + self.u, self.rho)

    def communicate(self) -> None:
        """z ← mean(xᵢ + uᵢ), uᵢ ← uᵢ + xᵢ − z, and the residuals."""
        if self.elastic is not None:
            self.elastic_round()
            return
        x = flat_params(self.params)
        w = x + self.u
        began = time.perf_counter()
        dist.all_reduce(w, op=dist.ReduceOp.SUM)
        w /= self.world_size
        z_prev, self.z = self.z, w
        self.check_finite(self.z, where="in z after the consensus round")
        r = x - self.z
        self.u += r
        local = r.double().square().sum().reshape(1)
        dist.all_reduce(local, op=dist.ReduceOp.SUM)
        nbytes = w.numel() * w.element_size() + local.numel() * local.element_size()
        self.meter.add(nbytes, time.perf_counter() - began)
        dual = torch.linalg.vector_norm((self.z - z_prev).double())
        self.meter.extra["primal_res"] = math.sqrt(max(float(local.item()), 0.0))
        self.meter.extra["dual_res"] = self.rho * math.sqrt(self.world_size) * float(dual)
        self._round_at = self.local_steps

    def elastic_round(self, *, joining: bool = False) -> int:
        """z ← mean(xᵢ + uᵢ) over the elastic group's members that bring a model; a
        replacement ``joining`` brings none, takes z as its x (its u stays 0).
        ``dual_res`` as usual; ``primal_res`` is left out (one more collective).
        Returns the round's step."""
        assert self.elastic is not None
        x = flat_params(self.params)
        w = x + self.u
        _, step = self.elastic.average([w], self.local_steps, self.meter, joining=joining)
        z_prev, self.z = self.z, w
        self.check_finite(self.z, where="in z after the consensus round")
        if joining:
            assign_flat(self.params, self.z)
            x = self.z.clone()
        self.u += x - self.z
        dual = torch.linalg.vector_norm((self.z - z_prev).double())
        self.meter.extra["dual_res"] = self.rho * math.sqrt(self.world_size) * float(dual)
        self._round_at = step
        return step

    def final_model(self) -> None:
        """A last round (z and u updates) when steps were taken since the previous
        one; then every worker ← z, buffers exchanged ← their mean. Collective."""
        if self._round_at != self.local_steps:
            self.communicate()
        assign_flat(self.params, self.z)
        if self.elastic is None:  # in place: the buffers stay each worker's own
            average_in_place(self.exchanged_buffers(), self.meter, self.world_size)

    def strategy_state(self) -> dict[str, Any]:
        return {"z": self.z.clone(), "u": self.u.clone()}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        for name in ("z", "u"):
            value = state.get(name)
            if value is not None:
                mine: torch.Tensor = getattr(self, name)
                setattr(self, name, value.to(mine.device, mine.dtype).clone())

    def shown_settings(self) -> dict[str, object]:
        """ρ and the local steps per round (the period)."""
        return {"rho": f"{self.rho:g}", "local_steps": self.period}


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Wrap ``optimizer`` in a consensus-ADMM optimizer; the model comes back unchanged.

    Promises: at world size 1 both objects come back unchanged. Otherwise ``z`` is
    initialised collectively (every rank must call this) as ``init`` says, ``uᵢ = 0``,
    and the returned optimizer runs one round every ``local_steps`` steps.
    """
    p = params_as(Params, params)
    if ctx.world_size == 1:
        return model, optimizer
    wrapped = ADMMOptimizer(
        optimizer,
        [q for q in model.parameters() if q.requires_grad],
        world_size=ctx.world_size,
        rho=resolve_rho(p, optimizers.family(optimizer), optimizers.effective_lr(optimizer)),
        local_steps=p.local_steps,
        init=p.init,
        elastic=elastic_start.averager(ctx),  # restart.mode: in_place
    )
    if wrapped.elastic is not None:
        first = functools.partial(wrapped.elastic_round, joining=True)
        elastic_start.begin(ctx, wrapped, wrapped.elastic, "admm", first, model=model)
    return model, wrapped
