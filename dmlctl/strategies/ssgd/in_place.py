"""ssgd whose workers outlive a lost one (``restart.mode: in_place``).

DDP is bound to the default process group, which cannot lose a member, so here the
gradients are averaged over the elastic group of :mod:`dmlctl.strategies.elastic`
instead: after ``loss.backward()``, one all-reduce of every gradient as one flat
buffer (in fp16/bf16 with those compressions), before the user's optimizer steps.
Every worker then holds the same parameters and optimizer state, as under DDP —
without DDP's overlap of communication with the backward pass, and with the average
taken in ``optimizer.step()``: gradient clipping before it acts on each worker's own
gradient (DDP: on the average), a ``step(closure)`` is refused, and a GradScaler
that skips the step on one worker only (an overflow there) leaves the workers'
all-reduces out of step.

A worker lost in a step: the others' all-reduce fails, they form the next
generation, whose rendezvous waits for the replacement; as it forms, the lowest-ranked
live worker hands the replacement the model (parameters and buffers), the optimizer
state and the step count (:class:`~dmlctl.strategies.elastic_start.Handover`); the
replacement's data goes on at that step, it runs its batch of the step its peers are
redoing, and joins their all-reduce with its gradient: the step is complete and the
world whole again. Nothing is read from disk and no batch of the survivors is lost.

With ``broadcast_buffers`` (the default) the end of training copies rank 0's buffers
to every worker over the elastic group (buffers are each worker's own in between:
DDP copies them before every forward instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.strategies import elastic_start
from dmlctl.strategies.elastic import ElasticAverager
from dmlctl.strategies.elastic_start import Handover
from dmlctl.strategies.ssgd.params import Params

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from dmlctl.runtime.context import Context

WIRE: dict[str, torch.dtype | None] = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
"""The dtype each compression that ``in_place`` takes sends gradients in."""


class ElasticGrads(StrategyOptimizer):
    """The user's optimizer, each gradient first averaged over the elastic group."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        world_size: int,
        elastic: ElasticAverager,
        wire: torch.dtype | None = None,
    ) -> None:
        super().__init__(inner, params, world_size=world_size)
        self.elastic = elastic
        self.wire = wire

    def before_step(self) -> None:
        """Every gradient ← its mean over the workers (one all-reduce; a parameter
        without a gradient counts as zero, so every worker steps every parameter)."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        self.elastic.average(grads, self.local_steps, self.meter, wire=self.wire)

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """The average, then the user's optimizer's step. No ``closure``: it would
        compute gradients after they were averaged (call ``backward`` before)."""
        if closure is not None:
            raise ValueError(
                "ssgd with restart.mode: in_place averages the gradients in "
                "optimizer.step(): call loss.backward() before it, without a closure"
            )
        return super().step()

    def communicate(self) -> None:
        """Nothing after the step: the gradients were averaged before it."""

    def handover(self, model: torch.nn.Module) -> Handover:
        """What a live worker hands a replacement: ``model``'s parameters and buffers,
        the user's optimizer's state and the steps taken."""

        def save() -> dict[str, Any]:
            return {
                "model": model.state_dict(),
                "optimizer": self.inner.state_dict(),
                "steps": self.local_steps,
            }

        def load(state: dict[str, Any]) -> None:
            model.load_state_dict(state["model"])
            self.inner.load_state_dict(state["optimizer"])
            self.local_steps = int(state["steps"])

        return Handover(save, load, "model, optimizer state and step", whole=True)


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, p: Params
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """ssgd over the elastic group (module docstring); more than one worker.

    Promises: the model comes back unwrapped with rank 0's parameters and floating-point
    buffers (a replacement: its peers' model, step and optimizer state); the optimizer
    comes back as an :class:`ElasticGrads` around ``optimizer``."""
    weights = elastic_start.starting_weights(ctx, model)
    group = elastic_start.averager(ctx)
    assert weights is not None and group is not None
    trained = [w for w in weights if w.requires_grad]  # as DDP: frozen ones send nothing
    opt = ElasticGrads(
        optimizer, trained, world_size=ctx.world_size, elastic=group, wire=WIRE[p.compression]
    )
    elastic_start.begin(ctx, opt, group, "ssgd", lambda: opt.local_steps, opt.handover(model))
    if p.broadcast_buffers:
        ctx.on_data_end(lambda: group.broadcast(list(model.buffers())))
    return model, opt
