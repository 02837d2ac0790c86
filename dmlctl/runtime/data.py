"""Data sharding: each rank iterates over its own slice of a map-style dataset.

:func:`shard_batches` is what ``Context.shard`` runs. Its promises:

* the slice comes from :class:`torch.utils.data.DistributedSampler`, so at a given
  epoch the ranks' slices are disjoint and together cover the dataset (with
  ``drop_last=False`` the sampler pads by repeating a few samples so every rank has
  the same number of batches — unequal batch counts would hang a synchronous
  strategy; with ``drop_last=True`` it drops the uneven tail instead);
* ``sampler.set_epoch(epoch)`` is called before every epoch, so with ``shuffle`` the
  order changes per epoch and is the same on every rank for a given ``seed``;
* batches are collated with ``default_collate`` (a tensor dataset is indexed in one
  shot) and moved to ``device``; nothing here synchronises with the device.

A strategy that decides itself which samples a worker takes (cyclades) passes its own
``planner`` (:data:`BatchPlanner`): the samples of each batch then come from it, and
the epochs, the callbacks, the collation and the move to ``device`` stay the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch.utils.data import Dataset, DistributedSampler, TensorDataset, default_collate


class MapDataset(Protocol):
    """Anything with ``len()`` and integer indexing: a Dataset, a Tensor, a list."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor moved to ``device`` (tuples, lists, dicts recursed).

    Non-tensor leaves come back as they are; on the tensors' own device this is free.
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def fetch(dataset: MapDataset, indices: list[int]) -> Any:
    """One collated batch of ``dataset[indices]``."""
    if isinstance(dataset, torch.Tensor):
        return dataset[torch.as_tensor(indices)]
    if isinstance(dataset, TensorDataset):
        idx = torch.as_tensor(indices)
        return tuple(t[idx] for t in dataset.tensors)
    return default_collate([dataset[i] for i in indices])


def batches_per_epoch(length: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """How many batches :func:`shard_batches` yields per epoch on every rank (the
    sampler pads, or with ``drop_last`` trims, to equal shares)."""
    if drop_last and length % world_size:
        share = math.ceil((length - world_size) / world_size)
    else:
        share = math.ceil(length / world_size)
    return share // batch_size if drop_last else math.ceil(share / batch_size)


@dataclass(frozen=True)
class Sharding:
    """Which samples a rank takes: the arguments of :func:`shard_batches` that a
    :data:`BatchPlanner` reads."""

    rank: int
    world_size: int
    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool


EpochPlan = Callable[[int], Iterable[list[int]]]
"""``plan(epoch)``: the dataset indices of each of this rank's batches in ``epoch``."""

BatchPlanner = Callable[[MapDataset, Sharding], EpochPlan]
"""Makes the :data:`EpochPlan` of a dataset for one :class:`Sharding` (called once per
:func:`shard_batches` call, before the first epoch)."""


def sampler_plan(dataset: MapDataset, sharding: Sharding) -> EpochPlan:
    """The default plan (module docstring): ``DistributedSampler``'s share of each
    epoch (``set_epoch`` first), cut into batches of ``batch_size``; with
    ``drop_last`` a last smaller batch is dropped too."""
    sampler: DistributedSampler[Any] = DistributedSampler(
        cast("Dataset[Any]", dataset),
        num_replicas=sharding.world_size,
        rank=sharding.rank,
        shuffle=sharding.shuffle,
        seed=sharding.seed,
        drop_last=sharding.drop_last,
    )
    size = sharding.batch_size

    def epoch_batches(epoch: int) -> Iterator[list[int]]:
        sampler.set_epoch(epoch)
        indices = list(sampler)
        stop = len(indices) - len(indices) % size if sharding.drop_last else len(indices)
        for begin in range(0, stop, size):
            yield indices[begin : begin + size]

    return epoch_batches


def shard_batches(
    dataset: MapDataset,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    start_epoch: int = 0,
    device: torch.device | None = None,
    on_epoch: Callable[[int], None] | None = None,
    on_batch: Callable[[int], None] | None = None,
    planner: BatchPlanner | None = None,
) -> Iterator[Any]:
    """Yield this rank's batches for epochs ``start_epoch .. epochs - 1``.

    ``epochs`` is the total number of epochs of the run, so resuming at
    ``start_epoch=3`` with ``epochs=5`` runs epochs 3 and 4. ``drop_last`` also drops a
    last batch smaller than ``batch_size``. ``on_epoch(epoch)`` runs before an
    epoch's first batch, ``on_batch(n)`` before each batch is yielded with its
    number of samples. ``planner`` chooses each batch's samples (default
    :func:`sampler_plan`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if start_epoch < 0:
        raise ValueError(f"start_epoch must be >= 0, got {start_epoch}")
    sharding = Sharding(rank, world_size, batch_size, shuffle, seed, drop_last)
    plan = (planner or sampler_plan)(dataset, sharding)
    for epoch in range(start_epoch, epochs):
        if on_epoch is not None:
            on_epoch(epoch)
        for chunk in plan(epoch):
            batch = fetch(dataset, chunk)
            if on_batch is not None:
                on_batch(len(chunk))
            yield batch if device is None else to_device(batch, device)
