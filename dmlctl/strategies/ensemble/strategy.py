"""Aggregation by model ensemble: ensemble-then-compress with knowledge distillation.

Update rule. Every worker ``i`` runs the user's optimizer on its own batches (local
steps) and remembers the inputs of its ``memory`` most recent training batches
(``D_i``). After every ``H = period`` local steps, one round:

1. every worker obtains every worker's model ``θ_1 … θ_K`` (one all-gather of the
   flat parameters and the buffers that change in training, :mod:`dmlctl.runtime.buffers`);
2. it labels its remembered inputs with the ensemble's averaged softened outputs::

       q(x) = (1/K) Σ_k softmax(f(x; θ_k) / T)

   (the members evaluated in eval mode, through ``torch.func.functional_call`` on
   views of the gathered buffer: no model is copied);
3. it distills the ensemble into its own model with ``distill_steps`` steps of the
   user's optimizer on::

       L(θ_i) = T² · mean_x KL(q(x) ‖ softmax(f(x; θ_i) / T))

   cycling over the remembered batches (Hinton, Vinyals & Dean 2015; the T² keeps the
   gradients' size as T changes);

and training goes on from the distilled model. The model's output must be a tensor of
logits with the classes along dim 1 (what ``F.cross_entropy`` takes).

Promises:

* ``prepare`` returns the model unchanged (not wrapped) and does not make the
  workers' initial models equal: an ensemble gains from diverse members, which start
  where the script put them; at world size 1 both objects come back unchanged (an
  ensemble of one is the model itself).
* Only forwards in training mode with gradients enabled are remembered (detached
  copies of their positional and keyword tensor arguments); evaluation under
  ``torch.no_grad()`` and the strategy's own forwards are not.
* Distillation leaves no gradients behind (they are cleared before and after) and is
  not counted in the optimizer's steps; the inner optimizer's state (momentum, Adam
  moments) carries through it, as it would through any other step.
* One round = one all-gather of the flat buffer, counted in ``comm_bytes_per_step`` as
  ``(K − 1) ×`` its bytes (what each worker sends in a ring all-gather). Reported in
  ``meter.extra``: ``distill_loss`` (the mean distillation loss of the latest round)
  and ``disagreement`` (the share of members' predictions on the remembered inputs
  that differ from the ensemble's, before distilling).
* :attr:`EnsembleOptimizer.targets` holds the latest round's ``q`` per remembered
  batch; :meth:`EnsembleOptimizer.member_logits` evaluates the latest gathered members
  on any input.
* Final model (:meth:`EnsembleOptimizer.final_model`): a last round when steps were
  taken since the previous one, then every worker takes rank 0's distilled model (one
  broadcast, counted). Every distilled model approximates the same ensemble, so any
  one will do; rank 0's makes all workers bit-identical. ``final: local`` keeps each
  worker's own model (no last round).

Remembered batches are not checkpointed: after a resume the memory refills from the
next training steps (a round with an empty memory gathers the models but distills
nothing). The parameters are :mod:`dmlctl.strategies.ensemble.params`'s; this module
imports torch (hosts only).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import BaseModel
from torch.func import functional_call

from dmlctl.runtime import staged
from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.strategies.common import assign_flat, flat_params, tensor_bytes
from dmlctl.strategies.ensemble.params import Params
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

Batch = tuple[tuple[Any, ...], dict[str, Any]]
"""A remembered forward call: its positional and keyword arguments."""


def detached(value: Any) -> Any:
    """``value`` with every tensor in it (at the top level) replaced by a detached
    copy; other values as they are."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def soft_targets(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The mean over members (dim 0 of ``logits``, stacked) of ``softmax(logits / T)``
    along the classes (dim 1 of each member's output)."""
    return torch.softmax(logits / temperature, dim=2).mean(dim=0)


def distill_loss(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T² · mean over samples of KL(targets ‖ softmax(logits / T))``, the classes
    along dim 1 (0·log 0 counts as 0)."""
    log_p = F.log_softmax(logits / temperature, dim=1)
    kl = (torch.special.xlogy(targets, targets) - targets * log_p).sum(dim=1)
    loss: torch.Tensor = kl.mean() * temperature**2
    return loss


class EnsembleOptimizer(StrategyOptimizer):
    """The user's optimizer plus an ensemble-and-distill round every ``period`` steps.

    ``model`` is the (unwrapped) model the optimizer trains; its parameters and the
    buffers that change in training (:mod:`dmlctl.runtime.buffers`) are what the
    workers exchange."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        model: torch.nn.Module,
        *,
        world_size: int,
        period: int,
        temperature: float,
        distill_steps: int,
        memory: int,
    ) -> None:
        super().__init__(inner, list(model.parameters()), world_size=world_size, period=period)
        self.model = model
        self.temperature = temperature
        self.distill_steps = distill_steps
        # the parameters, then (from the first round) the buffers exchanged
        self.named: list[tuple[str, torch.Tensor]] = list(model.named_parameters())
        self.memory: deque[Batch] = deque(maxlen=memory)
        self.members: list[torch.Tensor] = []  # flat buffers gathered at the latest round
        self.targets: list[torch.Tensor] = []  # q per remembered batch, latest round
        self._busy = False  # the strategy itself runs the model: remember nothing
        self._round_at = 0  # local_steps at the latest round
        self._hook = model.register_forward_pre_hook(self._remember, with_kwargs=True)

    def _remember(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Forward pre-hook: keep a detached copy of a training forward's inputs."""
        if self._busy or not module.training or not torch.is_grad_enabled():
            return
        self.memory.append(
            (tuple(detached(a) for a in args), {k: detached(v) for k, v in kwargs.items()})
        )

    def exchanged(self) -> list[tuple[str, torch.Tensor]]:
        """The named tensors a round gathers: the parameters and the buffers exchanged
        (decided at the first call: collective over every rank then)."""
        if not self.buffers.resolved:
            chosen = {id(b) for b in self.exchanged_buffers()}
            self.named += [(n, b) for n, b in self.model.named_buffers() if id(b) in chosen]
        return self.named

    def gather(self) -> list[torch.Tensor]:
        """Every worker's flat parameters and floating-point buffers, in rank order
        (one all-gather, counted in the meter). Collective."""
        mine = flat_params([t for _, t in self.exchanged()])
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        began = time.perf_counter()
        staged.all_gather(out, mine)
        self.meter.add((self.world_size - 1) * tensor_bytes([mine]), time.perf_counter() - began)
        return out

    def as_tensors(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``flat`` (laid out as :meth:`gather` lays it out) as views named like the
        model's parameters and buffers, for ``functional_call``."""
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for name, t in self.named:
            out[name] = flat[offset : offset + t.numel()].view_as(t)
            offset += t.numel()
        return out

    def member_logits(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The outputs of the members gathered at the latest round on these inputs,
        stacked along a new dim 0 (rank order), computed in eval mode without
        gradients; this worker's model is left as it was (each submodule's mode too)."""
        modes = [(m, m.training) for m in self.model.modules()]
        self._busy = True
        try:
            self.model.eval()
            with torch.no_grad():
                outs = [
                    functional_call(self.model, self.as_tensors(m), args, kwargs)
                    for m in self.members
                ]
        finally:
            for module, training in modes:
                module.training = training
            self._busy = False
        if not all(isinstance(o, torch.Tensor) and o.dim() >= 2 for o in outs):
            raise TypeError("ensemble: the model must return a tensor of logits (N, classes, …)")
        return torch.stack(outs)

    def distill(self, batches: Sequence[Batch], targets: Sequence[torch.Tensor]) -> float:
        """``distill_steps`` steps of the inner optimizer on :func:`distill_loss`,
        cycling over ``batches``; gradients cleared before and after. The mean loss."""
        self.inner.zero_grad(set_to_none=True)
        total = torch.zeros(())
        self._busy = True
        try:
            for s in range(self.distill_steps):
                args, kwargs = batches[s % len(batches)]
                loss = distill_loss(
                    self.model(*args, **kwargs), targets[s % len(batches)], self.temperature
                )
                torch.autograd.backward(loss)
                self.inner.step()
                self.inner.zero_grad(set_to_none=True)
                total += loss.detach().cpu()
        finally:
            self._busy = False
        return float(total.item()) / self.distill_steps

    def communicate(self) -> None:
        """One round: gather the members, label the remembered inputs with the
        ensemble's soft targets, distill them into this worker's model."""
        self.members = self.gather()
        self._round_at = self.local_steps
        batches = list(self.memory)
        if not batches:
            return
        disagree, seen = 0.0, 0
        self.targets = []
        for args, kwargs in batches:
            logits = self.member_logits(*args, **kwargs)
            q = soft_targets(logits, self.temperature)
            self.targets.append(q)
            differs = logits.argmax(dim=2) != q.argmax(dim=1)
            disagree += float(differs.float().sum().item())
            seen += differs.numel()
        self.meter.extra["disagreement"] = disagree / max(seen, 1)
        self.meter.extra["distill_loss"] = self.distill(batches, self.targets)
        self.check_finite(list(self.params), where="after distillation")

    def final_model(self) -> None:
        """A last round when steps were taken since the previous one, then every
        worker ← rank 0's parameters and buffers exchanged (one broadcast, counted).
        Collective."""
        if self._round_at != self.local_steps:
            self.communicate()
        tensors = [t for _, t in self.exchanged()]
        flat = flat_params(tensors)
        began = time.perf_counter()
        dist.broadcast(flat, src=0)
        self.meter.add(tensor_bytes([flat]), time.perf_counter() - began)
        assign_flat(tensors, flat)

    def strategy_state(self) -> dict[str, Any]:
        return {"round_at": self._round_at}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self._round_at = int(state.get("round_at", 0))

    def shown_settings(self) -> dict[str, object]:
        """The period and the distillation's settings."""
        shown = {"temperature": f"{self.temperature:g}", "distill_steps": self.distill_steps}
        return {**super().shown_settings(), **shown, "memory": self.memory.maxlen}


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Wrap ``optimizer`` in an :class:`EnsembleOptimizer`; the model comes back
    unchanged (a forward pre-hook on it remembers the training inputs).

    Promises: see the module docstring. ``model`` must already be on ``ctx.device``;
    the optimizer must be built on its parameters."""
    p = params_as(Params, params)
    if ctx.world_size == 1:
        return model, optimizer
    wrapped = EnsembleOptimizer(
        optimizer,
        model,
        world_size=ctx.world_size,
        period=p.period,
        temperature=p.temperature,
        distill_steps=p.distill_steps,
        memory=p.memory,
    )
    return model, wrapped
