"""Elastic averaging SGD, synchronous (Zhang, Choromanska & LeCun, NeurIPS 2015).

Every worker ``i`` keeps its own replica ``xᵢ``; a *center* variable ``x̃`` (held
identically by every worker — there is no parameter server) links them through an
elastic force. With ``η`` the learning rate, ``p`` workers and ``τ`` the period, on
every ``τ``-th step (the communication steps)::

    xᵢ ← xᵢ − η (gᵢ + ρ (xᵢ − x̃))                       (each worker)
    x̃  ← x̃ + α Σᵢ (xᵢ − x̃) = (1 − pα) x̃ + α Σᵢ xᵢ      (one all-reduce)

and on the other steps ``xᵢ ← xᵢ − η gᵢ`` (the user's optimizer alone). Both lines use
the same ``xᵢ − x̃``, measured before the step, so with ``ηρ = α`` what a worker is
pulled by, the center gains: the paper's symmetric elastic exchange. For ``τ = 1``
and plain SGD this is exactly the paper's synchronous EASGD (its eqs. 5–6); for
``τ > 1`` it is the paper's EASGD with communication period τ (its Algorithm 1, run
synchronously), the elastic exchange and the gradient step merged into one step.
With ``α ≤ 1/p`` the center update is a convex combination of ``x̃`` and the
replicas; :func:`~dmlctl.strategies.easgd.params.check_world` rejects ``α > 1/p``
before anything starts.

The elastic pull ``ηρ (xᵢ − x̃)`` is applied to the parameters directly, before the
user's optimizer takes its step, never through it: the paper's own form for a local
optimizer with momentum (EAMSGD, its Algorithm 2). With plain SGD this is exactly the
rule above; with momentum, Nesterov, Adam or AdamW the pull keeps its strength ``ηρ``
(through the optimizer, momentum would carry it on for ``1/(1 − μ)`` steps and Adam
would normalise it and count it in its second moment, and a ``ρ`` right for SGD
would be far too strong or drown the gradients).

Defaults: ``α = β / p`` (the paper's ``β = pα`` parametrisation, ``β = 0.9``) and
``ρ = α / η`` with ``η`` the optimizer's first param group's ``lr`` at
:func:`prepare` time (the paper's ``α = ηρ``): the pull equals the center's rate,
whatever the optimizer's family. ``η`` in the pull is the ``lr`` of the step, so an
LR scheduler that lowers ``lr`` weakens the workers' pull (``ηρ``) but not the
center's (``α``). Setting ``alpha`` and ``rho`` independently is allowed; the
exchange is then asymmetric.

At the end of training (:meth:`finish`) a last exchange folds in the steps since
the previous one and every worker takes the center — the algorithm's result — and
the mean of the buffers that change in training (:mod:`dmlctl.runtime.buffers`;
constant and integer buffers stay as they are); ``final: local`` keeps each replica.

At start, rank 0's parameters are broadcast to every worker and the center starts
there (the paper's common ``x⁰``); buffers (e.g. BatchNorm statistics) stay local.
``consensus`` (``meter.extra``) is ``sqrt(mean_i ||xᵢ − x̃||²)`` at the last
communication, from the same all-reduce. The center is strategy state
(:meth:`strategy_state` / :meth:`load_strategy_state`), so checkpoints carry it.

The parameters, their defaults and :func:`~dmlctl.strategies.easgd.params.check_world`
are :mod:`dmlctl.strategies.easgd.params`'s; this module imports torch (hosts only).
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
from dmlctl.strategies import elastic_start
from dmlctl.strategies.common import (
    ChangeFilter,
    assign_flat,
    average_in_place,
    flat_params,
    segments,
)
from dmlctl.strategies.easgd.params import Params, check_world, resolve_alpha, resolve_rho
from dmlctl.strategies.elastic import ElasticAverager
from dmlctl.strategies.optimizers import first_lr
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


class EASGDOptimizer(StrategyOptimizer):
    """The user's optimizer plus the elastic force and the center's update."""

    coupling: ClassVar[dict[str, str]] = {"rho": "rho", "alpha": "alpha"}

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        world_size: int,
        period: int,
        alpha: float,
        rho: float,
        threshold: float = 0.0,
        elastic: ElasticAverager | None = None,
    ) -> None:
        super().__init__(inner, params, world_size=world_size, period=period)
        self.alpha = alpha
        self.rho = rho
        #: ``restart.mode: in_place``: exchanges over groups that outlive a lost worker
        #: (:mod:`dmlctl.strategies.elastic`); a replacement takes the center there.
        self.elastic = elastic
        start = flat_params(self.params)
        if elastic is None or not rejoin.rejoining():
            dist.broadcast(start, src=0)
        assign_flat(self.params, start)
        self.center: torch.Tensor = start
        self.places = segments(self.params)
        self.filter = (
            ChangeFilter(self.params, threshold, [start[o : o + n] for o, n in self.places])
            if threshold > 0
            else None
        )
        self.last_sent: list[int] = []  # tensors the latest center update included
        self._chosen: list[int] = []  # tensors the exchange under way includes
        self._diff: torch.Tensor | None = None
        self._exchanged_at = 0  # local_steps at the latest center update

    def before_step(self) -> None:
        """On a step that ends a period: choose the tensors this exchange includes
        (all, or with the model filter those some worker is far enough from the
        center in: a collective), then xᵢ ← xᵢ − ηρ (xᵢ − x̃) on them, and keep
        xᵢ − x̃ for the center update. Other steps are the user's optimizer alone."""
        n = self.local_steps + 1  # the step about to be taken, as due() counts
        if n > self.warmup and (n - self.warmup) % self.period:
            return
        flat = flat_params(self.params)
        diff = flat - self.center
        self._chosen = self._choose(diff)
        pull = first_lr(self.inner) * self.rho
        for o, k in (self.places[i] for i in self._chosen):
            flat[o : o + k].sub_(diff[o : o + k], alpha=pull)
        assign_flat(self.params, flat)
        self._diff = diff

    def communicate(self) -> None:
        """x̃ ← x̃ + α Σᵢ (xᵢ − x̃) on the chosen tensors (one all-reduce), and the
        consensus distance."""
        if self.elastic is not None:
            self.elastic_exchange()
            return
        diff = self._diff
        if diff is None:  # step() always runs before_step first; be safe anyway
            diff = flat_params(self.params) - self.center
            self._chosen = self._choose(diff)
        self._diff = None
        chosen = self._chosen
        parts = [diff[o : o + n] for o, n in (self.places[i] for i in chosen)]
        buf = torch.cat([*parts, diff.square().sum().reshape(1)])
        began = time.perf_counter()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        self.meter.add(buf.numel() * buf.element_size(), time.perf_counter() - began)
        pos = 0
        for o, n in (self.places[i] for i in chosen):
            self.center[o : o + n].add_(buf[pos : pos + n], alpha=self.alpha)
            pos += n
        self.check_finite(self.center, where="in the center after the elastic update")
        sq = max(float(buf[-1].item()), 0.0)
        self.meter.extra["consensus"] = math.sqrt(sq / self.world_size)
        self._exchanged_at = self.local_steps

    def elastic_exchange(self, *, joining: bool = False) -> int:
        """x̃ ← x̃ + α Σᵢ (xᵢ − x̃) over the elastic group: the round's mean of the
        differences times the members that brought one, the center riding along (alike
        on every member: a replacement ``joining`` receives it and starts there).
        Returns the round's step."""
        assert self.elastic is not None
        diff = self._diff if self._diff is not None else flat_params(self.params) - self.center
        self._diff = None
        tensors = [diff, self.center]
        _, step = self.elastic.average(tensors, self.local_steps, self.meter, joining=joining)
        self.center.add_(diff, alpha=self.alpha * self.elastic.weight)
        if joining:
            assign_flat(self.params, self.center)
        self.check_finite(self.center, where="in the center after the elastic update")
        self._exchanged_at = step
        return step

    def _choose(self, diff: torch.Tensor, *, everything: bool = False) -> list[int]:
        """The tensors an exchange includes: all (``everything``, or without the
        filter), or those whose distance from the center exceeds ``threshold`` × the
        center's norm on some worker (``sent_share`` reports their share of the
        elements). A tensor left out is neither pulled nor sent: its distance grows
        until it is (carried forward, not lost)."""
        if self.filter is None or everything:
            self.last_sent = list(range(len(self.params)))
            return self.last_sent
        changes = [diff[o : o + n] for o, n in self.places]
        self.last_sent = self.filter.select(self.params, self.meter, changes=changes)
        sent = sum(self.places[i][1] for i in self.last_sent)
        self.meter.extra["sent_share"] = sent / max(diff.numel(), 1)
        return self.last_sent

    def final_model(self) -> None:
        """A last center update, of every tensor, when steps were taken since the
        previous one or the model filter left tensors out; then every worker ← the
        center, buffers exchanged ← their mean (collective)."""
        if self._exchanged_at != self.local_steps or self.filter is not None:
            self._diff = flat_params(self.params) - self.center
            self._chosen = self._choose(self._diff, everything=True)
            self.communicate()
        assign_flat(self.params, self.center)
        if self.elastic is None:  # in place: the buffers stay each worker's own
            average_in_place(self.exchanged_buffers(), self.meter, self.world_size)

    def strategy_state(self) -> dict[str, Any]:
        return {"center": self.center.clone()}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        center = state.get("center")
        if center is not None:  # in place: the filter's references are views of it
            self.center.copy_(center.to(self.center.device, self.center.dtype))
        self._diff = None

    def shown_settings(self) -> dict[str, object]:
        """The period and the coupling weights α and ρ."""
        return {**super().shown_settings(), "alpha": f"{self.alpha:g}", "rho": f"{self.rho:g}"}


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Wrap ``optimizer`` in an EASGD optimizer; the model comes back unchanged.

    Promises: at world size 1 both objects come back unchanged. Otherwise rank 0's
    parameters are broadcast to every rank (collective), the center starts there,
    and the returned optimizer applies the update rules of this module's docstring.
    Raises ValueError when α > 1/p, or when ρ is unset and the lr is not positive.
    The defaults hold for every optimizer (the pull bypasses it: module docstring).
    """
    p = params_as(Params, params)
    if ctx.world_size == 1:
        return model, optimizer
    message = check_world(p, ctx.world_size)
    if message:
        raise ValueError(f"easgd: {message}")
    alpha = resolve_alpha(p, ctx.world_size)
    rho = resolve_rho(p, alpha, first_lr(optimizer))
    wrapped = EASGDOptimizer(
        optimizer,
        [q for q in model.parameters() if q.requires_grad],
        world_size=ctx.world_size,
        period=p.period,
        alpha=alpha,
        rho=rho,
        threshold=p.threshold,
        elastic=elastic_start.averager(ctx),  # restart.mode: in_place (no threshold)
    )
    if wrapped.elastic is not None:
        first = functools.partial(wrapped.elastic_exchange, joining=True)
        elastic_start.begin(ctx, wrapped, wrapped.elastic, "easgd", first, model=model)
    return model, wrapped
