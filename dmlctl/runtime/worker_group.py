"""The collectives a script calls over the workers (:class:`WorkerGroup`): the part of
:class:`~dmlctl.runtime.context.Context` behind ``barrier`` and ``all_reduce_mean``.
With parameter servers the group is the workers' own (servers never take part); in a
world of one nothing is communicated."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dmlctl.runtime.rejoin import StoreGroup


class WorkerGroup:
    """``world`` workers in ``group`` (None: the default group); tensors on ``device``."""

    def __init__(
        self, group: Any, world: int, device: torch.device, store: StoreGroup | None = None
    ) -> None:
        self.group, self._world, self._device = group, world, device
        self._store = store  # restart.mode: in_place: through the run's store

    def barrier(self) -> None:
        """Wait until every worker gets here."""
        if self._world > 1 and self._store is not None:
            self._store.gather(0.0)
        elif self._world > 1:
            _joined("ctx.barrier")
            dist.barrier(group=self.group)

    def mean(self, value: float | torch.Tensor) -> float:
        """Mean of a scalar over the workers, on every worker (``ValueError`` for a
        tensor of more than one element). Collective."""
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"expected a scalar, got shape {tuple(value.shape)}")
            tensor = value.detach().reshape(()).to(self._device, torch.float64)
        else:
            tensor = torch.tensor(float(value), dtype=torch.float64, device=self._device)
        if self._world > 1 and self._store is not None:
            values = self._store.gather(float(tensor.item()))  # the workers not gone
            return sum(values.values()) / len(values)
        if self._world > 1:
            _joined("ctx.all_reduce_mean")
            tensor = tensor.clone()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
            tensor /= self._world
        return float(tensor.item())


def _joined(what: str) -> None:
    """Raise a clear error in a worker started again in place, which took no part in
    the world's meeting: it has no collective with the other workers."""
    if not dist.is_initialized():
        raise RuntimeError(
            f"{what}: this worker replaced a lost one in place (restart.mode: in_place) "
            "and takes part in no collective of the workers; use restart.mode: full"
        )
