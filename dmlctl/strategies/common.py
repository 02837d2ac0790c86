"""Tensor helpers several strategies share (runtime side only: imports torch).

* :func:`flat_params` / :func:`assign_flat` — one contiguous tensor of a model's
  parameters (one collective instead of one per tensor) and back;
* :func:`model_tensors` — the parameters and floating-point buffers every rank starts
  with equal; :func:`broadcast_from_rank0` — every rank starts from rank 0's
  (:func:`start_from_rank0`: a whole model's);
  :func:`with_exchanged_buffers` — a round's tensors plus the buffers exchanged
  (:mod:`dmlctl.runtime.buffers`);
* :func:`mean_and_consensus` — the mean over a group as one flat buffer, and how far
  apart the replicas were; :func:`consensus_distance` — the same distance to a known
  mean; :func:`average_round` — a global round of the model-averaging strategies (the
  tensors a :class:`ChangeFilter` picks, or all);
* :func:`add_to_grads` — a flat term added to the gradients (a penalty's or an
  elastic force's gradient, which then goes through the user's optimizer);
* :func:`delta_rule` — the parameter servers' rule for pushed changes (asgd, ssp);
* :func:`average_in_place` — every worker's tensors become their mean (the final
  model of the averaging strategies).

The control plane never imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dmlctl.runtime.optimizer import CommMeter, StrategyOptimizer

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes the ``tensors`` occupy (what sending them costs)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def flat_params(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parameters' data concatenated into one new 1-D tensor."""
    return torch.cat([p.detach().reshape(-1) for p in params])


def assign_flat(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` (as made by :func:`flat_params`) back into the parameters."""
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


def model_tensors(
    model: torch.nn.Module,
) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
    """The model's parameters and its floating-point buffers: what a strategy makes
    equal on every rank at the start (which buffers it then exchanges is
    :mod:`dmlctl.runtime.buffers`'s rule)."""
    return list(model.parameters()), [b for b in model.buffers() if b.is_floating_point()]


def with_exchanged_buffers(
    opt: StrategyOptimizer, tensors: list[torch.Tensor], change: ChangeFilter | None = None
) -> list[torch.Tensor]:
    """``tensors`` (the parameters a round exchanges) with the buffers ``opt``
    exchanges appended, in place, at the first call (collective over every rank
    then: :meth:`~dmlctl.runtime.optimizer.StrategyOptimizer.exchanged_buffers`);
    ``change``, the round's model filter, measures their changes from the start."""
    if not opt.buffers.resolved:
        buffers = opt.exchanged_buffers()
        tensors.extend(buffers)
        if change is not None:
            change.extend([opt.buffers.start(b) for b in buffers])
    return tensors


def broadcast_from_rank0(tensors: Sequence[torch.Tensor]) -> None:
    """Make every rank's ``tensors`` equal to rank 0's (one broadcast of a flat buffer;
    setup, so not counted as training traffic)."""
    if not tensors:
        return
    flat = flat_params(tensors)
    dist.broadcast(flat, src=0)
    assign_flat(tensors, flat)


def start_from_rank0(ctx: Context, model: torch.nn.Module) -> list[torch.nn.Parameter] | None:
    """The model's parameters once every rank holds rank 0's parameters and
    floating-point buffers (one broadcast, collective); None at world size 1, where
    nothing is sent (a strategy then leaves model and optimizer as they are)."""
    if ctx.world_size == 1:
        return None
    weights, buffers = model_tensors(model)
    broadcast_from_rank0([*weights, *buffers])
    return weights


def mean_and_consensus(
    tensors: Sequence[torch.Tensor],
    n_params: int,
    meter: CommMeter,
    group: dist.ProcessGroup | None,
    size: int,
) -> tuple[torch.Tensor, float]:
    """Mean of ``tensors`` over ``group`` (``size`` ranks) as one flat buffer, and the
    consensus distance of the first ``n_params`` elements measured before averaging.

    One all-reduce of the flat buffer (counted in ``meter``) and one of a float64
    scalar: ``||x_i − x̄||²`` is local once ``x̄`` is known (not counted). Collective
    over ``group``."""
    local = flat_params(tensors)
    mean = local.clone()
    start = time.perf_counter()
    dist.all_reduce(mean, op=dist.ReduceOp.SUM, group=group)
    mean /= size
    meter.add(tensor_bytes([mean]), time.perf_counter() - start)
    diff = (local[:n_params] - mean[:n_params]).to(torch.float64)
    spread = torch.sum(diff * diff).reshape(1)
    dist.all_reduce(spread, op=dist.ReduceOp.SUM, group=group)
    return mean, float(torch.sqrt(spread / size).item())


class ChangeFilter:
    """The ``threshold`` model filter: a round sends only the tensors whose change
    since they were last sent is large, ``‖x − x_sent‖ > threshold · ‖x_sent‖``, on at
    least one worker (so every worker sends the same tensors); a skipped tensor keeps
    its change, which counts at the next round (carried forward, not lost)."""

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        threshold: float,
        references: Sequence[torch.Tensor] | None = None,
    ) -> None:
        """``references``: what each tensor's change is measured from, kept up to date
        by the caller (EASGD: views of the center); default: copies of ``tensors``
        now, updated by :meth:`mark_sent`."""
        self.threshold = threshold
        self.sent = (
            list(references) if references is not None else [t.detach().clone() for t in tensors]
        )

    def extend(self, references: Sequence[torch.Tensor]) -> None:
        """Filter more tensors (appended after those it has), their changes measured
        from ``references`` (what they held when they were last the same everywhere)."""
        self.sent.extend(r.detach().clone() for r in references)

    def select(
        self,
        tensors: Sequence[torch.Tensor],
        meter: CommMeter,
        group: dist.ProcessGroup | None = None,
        changes: Sequence[torch.Tensor] | None = None,
    ) -> list[int]:
        """Indices of the tensors this round sends: one all-reduce (MAX) of a float32
        flag per tensor, counted in ``meter``. ``changes``: each tensor's change when
        the caller has it (default: the tensor minus its reference). Collective over
        ``group``."""
        if changes is None:
            changes = [t.detach() - s for t, s in zip(tensors, self.sent, strict=True)]
        flags = torch.tensor(
            [
                float(
                    torch.linalg.vector_norm(c.double())
                    > self.threshold * torch.linalg.vector_norm(s.double())
                )
                for c, s in zip(changes, self.sent, strict=True)
            ],
            dtype=torch.float32,
        )
        start = time.perf_counter()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        meter.add(tensor_bytes([flags]), time.perf_counter() - start)
        return [i for i, f in enumerate(flags.tolist()) if f > 0]

    def mark_sent(self, indices: Sequence[int], tensors: Sequence[torch.Tensor]) -> None:
        """Remember the values the tensors ``indices`` hold now as sent."""
        for i in indices:
            self.sent[i].copy_(tensors[i].detach())


def average_round(
    opt: StrategyOptimizer,
    tensors: list[torch.Tensor],
    change: ChangeFilter | None,
    update: Callable[[list[int], torch.Tensor], None] | None = None,
    where: str = "after averaging",
) -> list[int]:
    """One global round over every worker: the ``tensors`` (``opt``'s parameters first,
    then buffers) that ``change`` picks, all without a filter, become their mean,
    which ``update(chosen, mean)`` may first rewrite in place (BMUF's block update).
    Reports ``consensus`` over the parameters averaged, and with a filter
    ``sent_share`` (the share of the elements sent), whose references then move to
    the values sent. Returns the indices averaged. Collective; the divergence guard
    (``check_finite``, naming ``where``) runs on the result."""
    chosen = change.select(tensors, opt.meter) if change else list(range(len(tensors)))
    picked = [tensors[i] for i in chosen]
    if change is not None:
        total = sum(t.numel() for t in tensors)
        opt.meter.extra["sent_share"] = sum(t.numel() for t in picked) / max(total, 1)
    if not picked:
        return chosen
    n_params = sum(tensors[i].numel() for i in chosen if i < len(opt.params))
    mean, spread = mean_and_consensus(picked, n_params, opt.meter, None, opt.world_size)
    opt.meter.extra["consensus"] = spread
    if update is not None:
        update(chosen, mean)
    assign_flat(picked, mean)
    if change is not None:
        change.mark_sent(chosen, tensors)
    opt.check_finite(mean, picked, where)
    return chosen


def consensus_distance(
    params: Sequence[torch.Tensor], mean: torch.Tensor, world_size: int
) -> float:
    """sqrt(mean over workers of ||x_i - mean||²): how far apart the replicas are.

    Collective (one scalar all-reduce, not counted as training traffic)."""
    local = torch.sum((flat_params(params) - mean) ** 2).reshape(1).to(torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.SUM)
    return float(torch.sqrt(local / world_size).item())


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


def delta_rule(scale: float | None, workers: int) -> dict[str, Any]:
    """The server rule of the delta-pushing strategies (asgd, ssp): add each pushed
    change times ``scale``, by default ``1/workers``."""
    return {"kind": "scaled_add", "alpha": scale if scale is not None else 1.0 / workers}


def average_in_place(
    tensors: Sequence[torch.Tensor], meter: CommMeter, world_size: int
) -> torch.Tensor | None:
    """Every worker's ``tensors`` ← their mean over all workers: one all-reduce of a
    flat buffer, counted in ``meter``. Returns the mean (None for no tensors).
    Collective over the default group."""
    if not tensors:
        return None
    mean = flat_params(tensors)
    start = time.perf_counter()
    dist.all_reduce(mean, op=dist.ReduceOp.SUM)
    mean /= world_size
    meter.add(tensor_bytes([mean]), time.perf_counter() - start)
    assign_flat(tensors, mean)
    return mean


def segments(tensors: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    """``(offset, numel)`` of each tensor in the flat concatenation of ``tensors``."""
    out, offset = [], 0
    for t in tensors:
        out.append((offset, t.numel()))
        offset += t.numel()
    return out
