"""A rank's checkpoints as its script sees them (:class:`RankCheckpoints`): the part of
:class:`~dmlctl.runtime.context.Context` behind ``resume`` and ``checkpoint``. It picks
the manager (whole files, or DCP shards for a laid-out model), saves the training state
with the data cursor's position when a save is due, and restores the newest checkpoint
valid on every rank, the cursor's position included."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dmlctl.runtime import checkpoint as ckpt
from dmlctl.runtime.cursor import DataCursor
from dmlctl.runtime.metrics import MetricLogger
from dmlctl.runtime.progress import TRACKER

if TYPE_CHECKING:
    from dmlctl.runtime.checkpoint_sharded import ShardedCheckpointManager


def manager_class(laid_out: bool) -> type[ckpt.CheckpointManager]:
    """The checkpoint manager class: DCP shards for a laid-out model (imported only
    then: torch.distributed.checkpoint takes seconds to import), else whole files."""
    if not laid_out:
        return ckpt.CheckpointManager
    from dmlctl.runtime.checkpoint_sharded import ShardedCheckpointManager

    return ShardedCheckpointManager


class RankCheckpoints:
    """Saves and resumes one rank (``manager`` None: a server, or no checkpoint dir)."""

    def __init__(
        self,
        manager: ckpt.CheckpointManager | None,
        *,
        laid_out: bool,
        cursor: DataCursor,
        metrics: MetricLogger,
    ) -> None:
        self._manager, self._laid_out = manager, laid_out
        self._cursor, self._metrics = cursor, metrics

    def _sharded(self) -> ShardedCheckpointManager | None:
        """The manager when it saves through DCP, else None."""
        if self._manager is None or not self._laid_out:
            return None
        from dmlctl.runtime.checkpoint_sharded import ShardedCheckpointManager

        assert isinstance(self._manager, ShardedCheckpointManager)
        return self._manager

    def resume(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[int, dict[str, Any]] | None:
        """(the step to continue from, the checkpoint's ``extra``) after restoring the
        newest checkpoint valid on every rank into ``model``, ``optimizer``, the
        strategy, the RNGs and the cursor; None when there is none. Collective."""
        sharded = self._sharded()
        if sharded is not None:
            sharded.bind(model, optimizer)
        with TRACKER.phase("resume"):
            found = self._manager.load_latest() if self._manager is not None else None
            if found is not None and sharded is not None:
                sharded.load_shards(found[0])
        if found is None:
            return None
        step, state = found
        if sharded is not None:
            from dmlctl.runtime.checkpoint_sharded import restore_small_state

            restore_small_state(state, model, optimizer)
        else:
            ckpt.restore_training_state(state, model, optimizer)
        self._cursor.resume_at = (int(state["data"]["epoch"]), int(state["data"]["batches"]))
        return step, dict(state.get("extra", {}))

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any],
    ) -> str | None:
        """Save after ``step`` completed steps when due, with ``extra``; the directory,
        or None (not due, or no checkpoints here). Collective."""
        if self._manager is None or not self._manager.due(step):
            return None
        at = {"epoch": self._cursor.epoch, "batches": self._cursor.batches}
        sharded = self._sharded()
        if sharded is not None:  # shards through DCP
            from dmlctl.runtime.checkpoint_sharded import small_state

            sharded.bind(model, optimizer)
            state = small_state(optimizer, lambda: ckpt.rank_state(model, **at, extra=extra))
        else:
            state = ckpt.training_state(model, optimizer, **at, extra=extra)
        with TRACKER.phase("checkpoint"):
            directory = self._manager.save(step, state)
        if self._manager.committed_here:
            self._metrics.checkpoint(step, directory)
        return directory
