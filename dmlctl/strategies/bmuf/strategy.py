"""BMUF: block-wise model update filtering (Chen & Huo, ICASSP 2016).

Update rule. Workers start a block from the same model and run τ = ``period`` local
steps of the user's optimizer. At the end of each block, with ``w_g`` the global model
the block started from and ``Δ`` the block momentum buffer (zero at the start)::

    G   = mean_i(w_i) − w_g          (the block's averaged update)
    Δ   ← η_b · Δ + ζ · G            (η_b = ``block_momentum``, ζ = ``block_lr``)
    w_g ← w_g + Δ
    w_i ← w_g                        (classic block momentum, CBM)
    w_i ← w_g + η_b · Δ              (``nesterov: true``, NBM)

``block_momentum`` defaults to ``1 − 1/N`` for ``N`` workers (the paper's choice), and
to ``0`` when the user's optimizer carries momentum of its own (SGD with momentum or
Nesterov, Adam's β₁): the two momenta compound (the step grows by
``1/((1 − μ)(1 − η_b))``). On scikit-learn's digits (2 workers, 15 epochs, SGD lr 0.05
momentum 0.9) ``1 − 1/N`` lost 3.6 points of test accuracy where ``0`` lost 0.8; on the
language-model table (AdamW) ``1 − 1/N`` ended 10.8 % above one process's validation
loss, ``0`` 1.6 %. At the end of training (:meth:`finish`) a last block update
folds in the steps since the previous one and every worker takes ``w_g``.

Promises:

* With ``block_momentum = 0`` and ``block_lr = 1`` the rule reduces to ``w_i ←
  mean_i(w_i)``: BMUF is then local SGD with the same period (up to rounding).
* Ranks start identical (rank 0's parameters and floating-point buffers broadcast
  once in ``prepare``) and hold identical parameters after every block: every rank
  computes the same update from the same all-reduced mean.
* One all-reduce of one flat buffer per block (parameters + the buffers that change
  in training, :mod:`dmlctl.runtime.buffers`; those buffers are plainly averaged, not
  block-filtered), counted in
  ``comm_bytes_per_step`` = ``buffer bytes / τ``. ``consensus`` is
  ``sqrt(mean_i ||w_i − mean(w)||²)`` just before the latest block's averaging.
* ``state_dict()`` carries ``w_g`` and ``Δ`` (tensors, float32 or wider) besides the
  inner optimizer's state, so a restart resumes the filter exactly.
* At world size 1 model and optimizer come back unchanged.

The parameters are :mod:`dmlctl.strategies.bmuf.params`'s; this module imports torch
(hosts only).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel

from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.strategies import elastic_start, optimizers
from dmlctl.strategies.bmuf.params import Params, resolve_block_momentum
from dmlctl.strategies.common import (
    ChangeFilter,
    assign_flat,
    average_round,
    flat_params,
    segments,
    with_exchanged_buffers,
)
from dmlctl.strategies.elastic import ElasticAverager
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


class BMUFOptimizer(StrategyOptimizer):
    """The user's optimizer plus a block-momentum filter every ``period`` steps.

    ``params`` and the buffers exchanged (:mod:`dmlctl.runtime.buffers`) are the
    tensors averaged; ``w_g`` starts at the current ``params``."""

    coupling: ClassVar[dict[str, str]] = {
        "block_lr": "block_lr",
        "block_momentum": "block_momentum",
    }

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        world_size: int,
        period: int,
        block_momentum: float,
        block_lr: float = 1.0,
        nesterov: bool = False,
        threshold: float = 0.0,
        elastic: ElasticAverager | None = None,
    ) -> None:
        super().__init__(inner, params, world_size=world_size, period=period)
        #: ``restart.mode: in_place``: blocks over groups that outlive a lost worker
        #: (:mod:`dmlctl.strategies.elastic`); parameters only.
        self.elastic = elastic
        self.tensors: list[torch.Tensor] = list(self.params)  # + buffers, first block
        self.filter = ChangeFilter(self.tensors, threshold) if threshold > 0 else None
        self.last_sent: list[int] = []  # tensors the latest block update averaged
        self.n_params = sum(p.numel() for p in self.params)
        self.block_momentum = block_momentum
        self.block_lr = block_lr
        self.nesterov = nesterov
        start = flat_params(self.params)
        # The filter runs in at least float32, whatever the parameters' dtype.
        dtype = torch.promote_types(start.dtype, torch.float32)
        self.global_params = start.to(dtype)  # w_g
        self.delta = torch.zeros_like(self.global_params)  # Δ
        self._blocked_at = 0  # local_steps at the latest block update

    def communicate(self) -> None:
        """One block: average the tensors (all, or those the ``threshold`` filter
        picks), then the block-momentum update of their part of ``w_g``."""
        if self.elastic is not None:
            self.elastic_block()
            return
        with_exchanged_buffers(self, self.tensors, self.filter)
        self._blocked_at = self.local_steps
        self.last_sent = average_round(
            self, self.tensors, self.filter, self._block_updates, "after the block update"
        )

    def elastic_block(self, *, joining: bool = False) -> int:
        """A block over the elastic group: the parameters' mean, with ``w_g`` and Δ
        (alike on every member: a replacement ``joining`` receives them), then the
        block update of all of them. Returns the block's step."""
        assert self.elastic is not None
        tensors = [*self.params, self.global_params, self.delta]
        _, step = self.elastic.average(tensors, self.local_steps, self.meter, joining=joining)
        self._blocked_at = step
        averaged = flat_params(self.params)
        self._block_update(averaged, 0, self.n_params)
        assign_flat(self.params, averaged)
        self.check_finite(averaged, self.params, "after the block update")
        return step

    def _block_updates(self, chosen: list[int], mean: torch.Tensor) -> None:
        """The block update (:meth:`_block_update`) of each parameter among the
        ``chosen`` tensors, on its part of ``mean`` (their flat mean, buffers
        included: those stay plainly averaged)."""
        places = segments(self.params)
        pos = 0
        for i in chosen:
            n = self.tensors[i].numel()
            if i < len(self.params):
                self._block_update(mean[pos : pos + n], *places[i])
            pos += n

    def _block_update(self, averaged: torch.Tensor, offset: int, n: int) -> None:
        """Δ ← η Δ + ζ (averaged − w_g), w_g ← w_g + Δ on one tensor's part of
        ``w_g``; ``averaged`` ← where the workers restart (w_g, or the Nesterov
        look-ahead)."""
        wg, delta = self.global_params[offset : offset + n], self.delta[offset : offset + n]
        delta.mul_(self.block_momentum).add_(averaged.to(wg.dtype) - wg, alpha=self.block_lr)
        wg.add_(delta)
        restart = wg + self.block_momentum * delta if self.nesterov else wg
        averaged.copy_(restart)

    def final_model(self) -> None:
        """A last block update when steps were taken since the previous one; then
        every worker ← ``w_g`` (without the Nesterov look-ahead). Collective."""
        if self._blocked_at != self.local_steps:
            self.communicate()
        assign_flat(self.params, self.global_params)

    def strategy_state(self) -> dict[str, Any]:
        return {"global_params": self.global_params.clone(), "delta": self.delta.clone()}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        """Restore ``w_g`` and ``Δ``; a state without them (e.g. saved by another
        strategy) leaves the current ones."""
        for key, target in (("global_params", self.global_params), ("delta", self.delta)):
            if key not in state:
                continue
            value = state[key]
            if not isinstance(value, torch.Tensor) or value.shape != target.shape:
                raise ValueError(
                    f"BMUF state {key!r} does not match this model "
                    f"({getattr(value, 'shape', type(value).__name__)} vs "
                    f"{tuple(target.shape)})"
                )
            target.copy_(value)

    def shown_settings(self) -> dict[str, object]:
        """The period and the block filter's settings."""
        shown = {"block_momentum": self.block_momentum, "block_lr": self.block_lr}
        return {**super().shown_settings(), **shown, "nesterov": self.nesterov}


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Broadcast rank 0's model and wrap ``optimizer`` in a ``BMUFOptimizer`` whose
    block momentum, unless the job sets it, follows from whether ``optimizer``
    carries momentum (:func:`~dmlctl.strategies.bmuf.params.resolve_block_momentum`).

    Promises: see the module docstring. ``model`` must already be on ``ctx.device``
    and ``optimizer`` built on its parameters."""
    p = params_as(Params, params)
    weights = elastic_start.starting_weights(ctx, model)
    if weights is None:
        return model, optimizer
    opt = BMUFOptimizer(
        optimizer,
        weights,
        world_size=ctx.world_size,
        period=p.period,
        block_momentum=resolve_block_momentum(
            p.block_momentum, ctx.world_size, optimizers.carries_momentum(optimizer)
        ),
        block_lr=p.block_lr,
        nesterov=p.nesterov,
        threshold=p.threshold,
        elastic=elastic_start.averager(ctx),  # restart.mode: in_place (no threshold)
    )
    if opt.elastic is not None:
        first = functools.partial(opt.elastic_block, joining=True)
        elastic_start.begin(ctx, opt, opt.elastic, "bmuf", first, model=model)
    return model, opt
