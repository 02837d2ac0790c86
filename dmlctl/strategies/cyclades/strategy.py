"""Cyclades: conflict-free asynchronous SGD on parameters shared in memory (Pan et al.,
NeurIPS 2016).

Like :mod:`~dmlctl.strategies.hogwild`, every worker of the run lives on one host
and updates one shared-memory copy of the parameters in place, without locks and
without communication. Unlike Hogwild!, no two workers ever write the same
coordinate at the same time: the data is processed in **rounds**. Each round every
worker draws the same ``B = sample_size`` samples (one shared permutation per
epoch), reads the coordinates each one's update touches (field ``coordinates`` of the
sample: its feature indices), and plans the round with
:func:`~dmlctl.strategies.cyclades.plan.plan_round`: the connected components of the
conflict graph, whole components given to the workers balanced by size. Each worker
then applies its components' updates in order, ``batch_size`` consecutive updates of
its list per optimizer step (a mini-batch may span components: they are all this
worker's), and a barrier ends the round. Updates of different
workers touch disjoint coordinates, so the result equals running the workers' lists
one after the other — exactly (tested bit for bit).

Promises:

* **Data.** Under cyclades :meth:`~dmlctl.runtime.context.Context.shard` yields this
  worker's batches of each round (:meth:`CycladesOptimizer.batch_plan`): every
  sample once per epoch over all workers; a batch never spans two rounds. Workers
  take different numbers of steps per round (the components' sizes differ).
* **Updates touch only their coordinates**, which serializability needs: every
  gradient must be sparse (``nn.Embedding``/``nn.EmbeddingBag`` with
  ``sparse=True``; a dense parameter such as a shared bias conflicts with every
  update) and the optimizer ``torch.optim.SGD`` without momentum or weight decay
  (which change untouched rows too). Anything else is refused with a message naming
  the parameter or the setting.
* **One host only**, parameters on the CPU and of one dtype, the same shared file
  and clean-up as hogwild. No checkpoints: workers save after different numbers of
  steps, which the collective save cannot pair (refused with a message).

Reported: ``rounds``, ``components`` (per round, mean) and ``largest_share`` (the
largest component's share of a round's updates, mean): how conflict-free the data is.

The parameters are :mod:`dmlctl.strategies.cyclades.params`'s; this module imports
torch (hosts only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from pydantic import BaseModel
from torch.utils.data import TensorDataset

from dmlctl.runtime.data import EpochPlan, MapDataset, Sharding
from dmlctl.strategies.cyclades.params import Params
from dmlctl.strategies.cyclades.plan import plan_round
from dmlctl.strategies.hogwild.strategy import HogwildOptimizer, share_model
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

PROBE = 1_000
"""Samples read to derive the default ``sample_size``."""


def sample_coordinates(sample: Any, field: int) -> list[int]:
    """The coordinates a sample's update touches: its field ``field`` (an integer
    tensor or sequence), flattened. Raises ValueError naming the field otherwise."""
    try:
        value = sample[field]
    except (IndexError, KeyError, TypeError):
        raise ValueError(
            f"cyclades: a sample has no field {field} (strategy.params.coordinates)"
        ) from None
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            raise ValueError(
                f"cyclades: field {field} of a sample is a float tensor; it must hold "
                "the integer feature indices its update touches (strategy.params.coordinates)"
            )
        return [int(c) for c in value.reshape(-1).tolist()]
    return [int(c) for c in value]


def round_coordinates(dataset: MapDataset, indices: Sequence[int], field: int) -> list[list[int]]:
    """:func:`sample_coordinates` of ``dataset[i]`` for every ``i`` in ``indices``: one
    indexing of the field's tensor for a ``TensorDataset``, else sample by sample."""
    if isinstance(dataset, TensorDataset) and field < len(dataset.tensors):
        column = dataset.tensors[field]
        if not column.is_floating_point():
            rows: list[list[int]] = (
                column[torch.as_tensor(indices)].reshape(len(indices), -1).tolist()
            )
            return rows
    return [sample_coordinates(dataset[i], field) for i in indices]


def derive_sample_size(coords: Sequence[Sequence[int]]) -> int:
    """``features / active²`` over ``coords`` (features: the largest coordinate + 1;
    active: mean coordinates per sample), at least 1: for coordinates drawn at random,
    about one conflict per sampled update — below the size where one component takes
    most of a round (measured on 20,000 features, 10 active: the largest component
    held 12 % of a round at this size, 77 % at twice it)."""
    active = sum(len(c) for c in coords) / max(len(coords), 1)
    features = 1 + max((max(c) for c in coords if c), default=0)
    return max(1, int(features / max(active, 1.0) ** 2))


class CycladesOptimizer(HogwildOptimizer):
    """The user's SGD on shared parameters, fed conflict-free rounds (module
    docstring); never communicates."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        params: Sequence[torch.nn.Parameter],
        *,
        world_size: int,
        rank: int,
        field: int,
        sample_size: int | None,
    ) -> None:
        super().__init__(inner, params, world_size=world_size)
        self.rank, self.field, self.sample_size = rank, field, sample_size
        self.rounds = 0
        self._components = 0
        self._largest = 0.0

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """The user's step, once every gradient is checked to be sparse."""
        for p in self.params:
            if p.grad is not None and not p.grad.is_sparse:
                name = self.tensor_names.get(id(p), "a parameter")
                raise RuntimeError(
                    f"cyclades: parameter {name!r} has a dense gradient, so its update "
                    "touches every coordinate and conflicts with all others; use "
                    "nn.Embedding/nn.EmbeddingBag(sparse=True) and no dense parameter"
                )
        return super().step(closure)

    def batch_plan(self, dataset: MapDataset, sharding: Sharding) -> EpochPlan:
        """This worker's batches, round by round (module docstring): the
        :data:`~dmlctl.runtime.data.BatchPlanner` that
        :meth:`~dmlctl.runtime.context.Context.shard` passes to
        :func:`~dmlctl.runtime.data.shard_batches` (``drop_last`` has no effect: a
        round's batches end with its components). Collective: a barrier ends every
        round."""
        n = len(dataset)

        def epoch_batches(epoch: int) -> Iterator[list[int]]:
            gen = torch.Generator().manual_seed(sharding.seed + epoch)
            order = (
                torch.randperm(n, generator=gen).tolist() if sharding.shuffle else list(range(n))
            )
            size = self.sample_size or derive_sample_size(
                round_coordinates(dataset, order[:PROBE], self.field)
            )
            for begin in range(0, n, size):
                chosen = order[begin : begin + size]
                coords = round_coordinates(dataset, chosen, self.field)
                plan = plan_round(coords, sharding.world_size)
                self._count(plan, len(chosen))
                mine = [chosen[j] for part in plan[sharding.rank] for j in part]
                for k in range(0, len(mine), sharding.batch_size):
                    yield mine[k : k + sharding.batch_size]
                dist.barrier()  # the round's updates are all in before the next one

        return epoch_batches

    def _count(self, plan: Sequence[Sequence[Sequence[int]]], updates: int) -> None:
        parts = [len(p) for lists in plan for p in lists]
        self.rounds += 1
        self._components += len(parts)
        self._largest += max(parts, default=0) / max(updates, 1)

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        if self.rounds:
            out.update(
                rounds=float(self.rounds),
                components=self._components / self.rounds,
                largest_share=self._largest / self.rounds,
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError(
            "cyclades: checkpoints are not supported (workers take different numbers "
            "of steps per round, which a collective save cannot pair); remove the "
            "job's checkpoint block"
        )

    def shown_settings(self) -> dict[str, object]:
        """The sample size of a round (None: derived)."""
        return {"sample_size": self.sample_size}


def check_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Raise RuntimeError unless ``optimizer`` updates only the rows its sparse
    gradients touch: ``torch.optim.SGD`` without momentum or weight decay."""
    if type(optimizer) is not torch.optim.SGD:
        raise RuntimeError(
            f"cyclades: {type(optimizer).__name__} may update coordinates an update did not "
            "touch; use torch.optim.SGD (no momentum, no weight decay)"
        )
    for group in optimizer.param_groups:
        for key in ("momentum", "weight_decay"):
            if float(group.get(key, 0.0) or 0.0) != 0.0:
                raise RuntimeError(
                    f"cyclades: SGD with {key}={group[key]} changes coordinates an update "
                    f"did not touch; set {key}=0"
                )


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Share the parameters in memory (as hogwild does) and wrap ``optimizer`` so that
    :meth:`~dmlctl.runtime.context.Context.shard` yields conflict-free rounds.
    Collective. Raises RuntimeError for an optimizer that is not plain SGD or workers
    on more than one host; at world size 1 both objects come back unchanged."""
    p = params_as(Params, params)
    if ctx.world_size == 1:
        return model, optimizer
    check_optimizer(optimizer)
    weights = share_model(ctx, model, "cyclades")
    opt = CycladesOptimizer(
        optimizer,
        weights,
        world_size=ctx.world_size,
        rank=ctx.rank,
        field=p.coordinates,
        sample_size=p.sample_size,
    )
    return model, opt
