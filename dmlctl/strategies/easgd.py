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
replicas; :func:`check_world` rejects ``α > 1/p`` before anything starts.

The elastic force ``ρ (xᵢ − x̃)`` is added to the gradients (in
:meth:`~dmlctl.strategies.base.StrategyOptimizer.before_step`) and so goes **through
the user's optimizer**: with plain SGD the pull is exactly ``ηρ (xᵢ − x̃)``; with
momentum or Adam it is filtered like any gradient (momentum carries it into later
steps, Adam normalises it and counts it in its second moment), so its strength is no
longer ``ηρ`` and the default ``ρ`` below is too strong — set ``rho`` explicitly
(a warning says so).

Defaults: ``α = β / p`` (the paper's ``β = pα`` parametrisation, ``β = 0.9``) and
``ρ = α / η`` with ``η`` the optimizer's first param group's ``lr`` at
:func:`prepare` time (the paper's ``α = ηρ``). Both are fixed from then on: an LR
scheduler that lowers ``lr`` weakens the workers' pull (``ηρ``) but not the center's
(``α``). Setting ``alpha`` and ``rho`` independently is allowed; the exchange is then
asymmetric.

At start, rank 0's parameters are broadcast to every worker and the center starts
there (the paper's common ``x⁰``); buffers (e.g. BatchNorm statistics) stay local.
``consensus`` (``meter.extra``) is ``sqrt(mean_i ||xᵢ − x̃||²)`` at the last
communication, from the same all-reduce. The center is strategy state
(:meth:`strategy_state` / :meth:`load_strategy_state`), so checkpoints carry it.

Importing this module is cheap (no torch): the control plane imports it for
:class:`Params` and :func:`check_world`.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from dmlctl.strategies.params import MAX_PERIOD, MAX_WEIGHT, PARAMS_CONFIG
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    import torch

    from dmlctl.runtime.context import Context
    from dmlctl.strategies.base import StrategyOptimizer

ROLES: tuple[str, ...] = ("worker",)


class Params(BaseModel):
    """``strategy.params`` of an ``easgd`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    period: int = Field(
        default=4,
        ge=1,
        le=MAX_PERIOD,
        description="τ: local steps between center updates (one all-reduce of the "
        "parameters' size per period).",
    )
    beta: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="β = pα: how far the center moves towards the workers' mean per "
        "update (β = 1: onto it). Used when alpha is not given.",
    )
    alpha: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WEIGHT,
        description="α, the moving rate of the center; default β/p. Must be ≤ 1/p "
        "(checked against the job's worker count).",
    )
    rho: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WEIGHT,
        description="ρ, the elastic force's strength added to the gradients; default "
        "α/η with η the optimizer's lr at start (so the worker's pull ηρ equals α, "
        "right for plain SGD; set it for Adam and the like, which rescale the term).",
    )


def resolve_alpha(params: Params, world_size: int) -> float:
    """α in use: ``params.alpha`` or ``β / p``."""
    return params.alpha if params.alpha is not None else params.beta / world_size


def resolve_rho(params: Params, alpha: float, lr: float) -> float:
    """ρ in use: ``params.rho`` or ``α / η``; raises ValueError when η is not positive."""
    if params.rho is not None:
        return params.rho
    if not lr > 0:
        raise ValueError(
            f"easgd: rho defaults to alpha / lr, but the optimizer's lr is {lr}; "
            "set strategy.params.rho"
        )
    return alpha / lr


def check_world(params: Params, world_size: int) -> str | None:
    """Why ``params`` cannot run on ``world_size`` workers, or None (α ≤ 1/p)."""
    alpha = resolve_alpha(params, world_size)
    bound = 1.0 / world_size
    if alpha > bound * (1 + 1e-12):
        return (
            f"alpha {alpha:g} > 1/p = {bound:g} for {world_size} workers: "
            "the center update would overshoot"
        )
    return None


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Wrap ``optimizer`` in an EASGD optimizer; the model comes back unchanged.

    Promises: at world size 1 both objects come back unchanged. Otherwise rank 0's
    parameters are broadcast to every rank (collective), the center starts there,
    and the returned optimizer applies the update rules of this module's docstring.
    Raises ValueError when α > 1/p, or when ρ is unset and the lr is not positive.
    """
    p = params_as(Params, params)
    if ctx.world_size == 1:
        return model, optimizer
    message = check_world(p, ctx.world_size)
    if message:
        raise ValueError(f"easgd: {message}")
    alpha = resolve_alpha(p, ctx.world_size)
    rho = resolve_rho(p, alpha, float(optimizer.param_groups[0]["lr"]))
    if p.rho is None and type(optimizer).__name__ != "SGD":
        warnings.warn(
            f"easgd: rho defaults to alpha / lr = {rho:g}, the paper's value for plain SGD;"
            f" {type(optimizer).__name__} rescales the elastic term like a gradient, so"
            " set strategy.params.rho for it (e.g. so rho * |x - center| is comparable"
            " to the gradients)",
            stacklevel=2,
        )
    cls = optimizer_class()
    wrapped = cls(
        optimizer,
        [q for q in model.parameters() if q.requires_grad],
        world_size=ctx.world_size,
        period=p.period,
        alpha=alpha,
        rho=rho,
    )
    return model, wrapped


@functools.cache
def optimizer_class() -> Callable[..., StrategyOptimizer]:
    """The EASGD optimizer class (defined on first use: it needs torch)."""
    import torch
    import torch.distributed as dist

    from dmlctl.strategies.base import StrategyOptimizer, assign_flat, flat_params

    class EASGDOptimizer(StrategyOptimizer):
        """The user's optimizer plus the elastic force and the center's update."""

        def __init__(
            self,
            inner: torch.optim.Optimizer,
            params: Sequence[torch.nn.Parameter],
            *,
            world_size: int,
            period: int,
            alpha: float,
            rho: float,
        ) -> None:
            super().__init__(inner, params, world_size=world_size, period=period)
            self.alpha = alpha
            self.rho = rho
            start = flat_params(self.params)
            dist.broadcast(start, src=0)
            assign_flat(self.params, start)
            self.center: torch.Tensor = start
            self._diff: torch.Tensor | None = None

        def before_step(self) -> None:
            """On a step that ends a period: add ρ (xᵢ − x̃) to the gradients and keep
            xᵢ − x̃ for the center update. Other steps are the user's optimizer alone."""
            n = self.local_steps + 1  # the step about to be taken, as due() counts
            if n > self.warmup and (n - self.warmup) % self.period:
                return
            diff = flat_params(self.params) - self.center
            add_to_grads(self.params, diff, self.rho)
            self._diff = diff

        def communicate(self) -> None:
            """x̃ ← x̃ + α Σᵢ (xᵢ − x̃) (one all-reduce), and the consensus distance."""
            diff = self._diff
            if diff is None:  # step() always runs before_step first; be safe anyway
                diff = flat_params(self.params) - self.center
            self._diff = None
            buf = torch.cat([diff, diff.square().sum().reshape(1)])
            began = time.perf_counter()
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            self.meter.add(buf.numel() * buf.element_size(), time.perf_counter() - began)
            self.center.add_(buf[:-1], alpha=self.alpha)
            sq = max(float(buf[-1].item()), 0.0)
            self.meter.extra["consensus"] = math.sqrt(sq / self.world_size)

        def strategy_state(self) -> dict[str, Any]:
            return {"center": self.center.clone()}

        def load_strategy_state(self, state: dict[str, Any]) -> None:
            center = state.get("center")
            if center is not None:
                self.center = center.to(self.center.device, self.center.dtype).clone()
            self._diff = None

        def __repr__(self) -> str:
            return (
                f"EASGDOptimizer({self.inner!r}, period={self.period}, "
                f"alpha={self.alpha:g}, rho={self.rho:g})"
            )

    return EASGDOptimizer


def add_to_grads(params: Sequence[torch.Tensor], flat: torch.Tensor, scale: float) -> None:
    """``p.grad += scale * slice`` for each parameter's slice of ``flat`` (a gradient is
    created for a parameter that has none, so the force also acts on it)."""
    offset = 0
    for q in params:
        n = q.numel()
        term = flat[offset : offset + n].view_as(q) * scale
        if q.grad is None:
            q.grad = term
        else:
            q.grad.add_(term)
        offset += n
