"""How a strategy with an elastic group starts (``restart.mode: in_place``): its group
(:func:`averager`), the weights it starts from (:func:`starting_weights`) and its first
generation (:func:`begin`: a replacement is handed its state, a :class:`Handover`, and
joins the round its peers retry). The group itself: :mod:`dmlctl.strategies.elastic`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dmlctl.runtime import rejoin, schedulers
from dmlctl.strategies.common import start_from_rank0
from dmlctl.strategies.elastic import ElasticAverager

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context
    from dmlctl.runtime.optimizer import StrategyOptimizer


@dataclass(frozen=True)
class Handover:
    """What a live member hands a replacement as a generation forms: ``save()`` its
    state (tensors, numbers, lists and dicts: ``torch.save``-able, loaded with
    ``weights_only``), ``load(state)`` in the replacement; ``what`` names it in the
    replacement's message."""

    save: Callable[[], dict[str, Any]]
    load: Callable[[dict[str, Any]], None]
    what: str
    whole: bool = False  # it holds the model too (else the first round brings it)


def optimizer_handover(optimizer: torch.optim.Optimizer) -> Handover:
    """The user's optimizer's state (momentum buffers, Adam's moments and step, the
    learning rates a scheduler set) as a :class:`Handover`."""
    return Handover(
        save=lambda: {"optimizer": optimizer.state_dict()},
        load=lambda state: optimizer.load_state_dict(state["optimizer"]),
        what="optimizer state",
    )


def _with_schedulers(handover: Handover, opt: StrategyOptimizer) -> Handover:
    """``handover`` plus the state of the LR schedulers that drive ``opt`` (or the
    optimizer inside it), which the replacement's own load at its first step
    (:mod:`dmlctl.runtime.schedulers`): their counters go on from the live worker's."""

    def save() -> dict[str, Any]:
        return {**handover.save(), "schedulers": schedulers.Handed.of(opt, opt.inner).to_state()}

    def load(state: dict[str, Any]) -> None:
        handover.load(state)
        opt.handed_schedulers = schedulers.Handed.from_state(state["schedulers"])

    return Handover(save, load, handover.what, handover.whole)


def averager(ctx: Context) -> ElasticAverager | None:
    """This worker's elastic group in a run that replaces workers in place (None
    otherwise, or alone); it goes on without a worker that no replacement came for
    within :func:`dmlctl.runtime.rejoin.rejoin_wait`."""
    if not rejoin.in_place() or ctx.world_size == 1:
        return None
    return ElasticAverager(ctx.rank, ctx.world_size, wait=rejoin.rejoin_wait())


def starting_weights(ctx: Context, model: torch.nn.Module) -> list[torch.nn.Parameter] | None:
    """``model``'s parameters as a strategy starts from them: rank 0's
    (:func:`~dmlctl.strategies.common.start_from_rank0`, None alone), or as they are
    in a replacement (its first round brings the model)."""
    if rejoin.in_place() and rejoin.rejoining() and ctx.world_size > 1:
        return list(model.parameters())
    return start_from_rank0(ctx, model)


def begin(
    ctx: Context,
    opt: StrategyOptimizer,
    elastic: ElasticAverager,
    strategy: str,
    first_round: Callable[[], int],
    handover: Handover | None = None,
    *,
    model: torch.nn.Module | None = None,
    steps: Callable[[], int] | None = None,
) -> None:
    """An optimizer with an elastic group starts: it joins its generation (a
    replacement is handed ``handover``'s state, by default the user's optimizer's);
    a replacement then runs ``first_round`` (the round its peers retry, with weight 0;
    it returns the round's step), and its step count and data go on there. Said once
    when ``model`` (given when its buffers are not exchanged) has buffers that change
    in training: they stay each worker's own. ``steps()``: what the members must
    agree on as a generation forms (default: the optimizer's steps)."""
    started = time.perf_counter()
    handover = _with_schedulers(handover or optimizer_handover(opt.inner), opt)
    elastic.join(handover, steps or (lambda: opt.local_steps))
    if rejoin.rejoining():
        step = first_round()
        opt.local_steps = step
        ctx.go_on_at(step)
        mean = "" if handover.whole else "peers' mean, "
        rejoin.say(
            f"rank {ctx.rank} rejoined at step {step}: {mean}{handover.what} from "
            f"rank {elastic.donor} (generation {elastic.generation}, "
            f"{(elastic.bytes + elastic.received) / 2**10:.1f} KiB, "
            f"{time.perf_counter() - started:.2f} s)"
        )
    if model is not None and any(b.is_floating_point() for b in model.buffers()):
        ctx.notice(
            f"restart.mode: in_place: {strategy} averages the parameters only; the "
            "buffers that change in training (BatchNorm statistics) stay each worker's own"
        )
