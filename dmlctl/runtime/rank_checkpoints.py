"""A rank's checkpoints as its script sees them (:class:`RankCheckpoints`): the part of
:class:`~dmlctl.runtime.context.Context` behind ``resume`` and ``checkpoint``. It picks
the manager (whole files, or DCP shards for a laid-out model), saves the training state
with the data cursor's position when a save is due, and restores the newest checkpoint
valid on every rank, the cursor's position included."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch

from dmlctl.runtime import checkpoint as ckpt
from dmlctl.runtime import rejoin
from dmlctl.runtime.cursor import DataCursor
from dmlctl.runtime.metrics import MetricLogger
from dmlctl.runtime.own_checkpoint import OwnPart
from dmlctl.runtime.progress import TRACKER

if TYPE_CHECKING:
    from dmlctl.runtime.checkpoint_sharded import ShardedCheckpointManager
    from dmlctl.runtime.env import RunEnv
    from dmlctl.runtime.identity import RankPlace


def manager_class(laid_out: bool) -> type[ckpt.CheckpointManager]:
    """The checkpoint manager class: DCP shards for a laid-out model (imported only
    then: torch.distributed.checkpoint takes seconds to import), else whole files."""
    if not laid_out:
        return ckpt.CheckpointManager
    from dmlctl.runtime.checkpoint_sharded import ShardedCheckpointManager

    return ShardedCheckpointManager


def checkpoint_manager(
    env: RunEnv, at: RankPlace, workers: tuple[int, ...], group: Any, laid_out: bool
) -> ckpt.CheckpointManager | None:
    """A worker's checkpoint manager (None without a checkpoint dir): its own file in a
    world of ``at.world`` ranks; with ``restart.mode: in_place`` one file that the first
    of the ``workers`` writes alone (no collective a replacement could not join) and
    every worker loads, agreeing on the step over ``group``."""
    if rejoin.in_place():
        first = workers[0]
        return manager_class(False).from_env(
            0, 1, group=group, src=first, writes=env.rank == first, peers=at.world
        )
    return manager_class(laid_out).from_env(
        at.rank, at.world, env.local_rank, group=group, src=workers[0]
    )


_OWN_KEYS = ("optimizer", "strategy", "rng")
"""What a worker takes from its own part when the model is not its own to take: a
parameter-server worker's (the servers hold it), or a synchronous worker's part of an
earlier step than the one agreed (:meth:`RankCheckpoints._own`)."""


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
        self._rank: int = 0
        self._workers: tuple[int, ...] = ()
        self._apart = False
        self._part: OwnPart | None = None  # a worker's own part, beside the writer's file

    def share(self, rank: int, workers: tuple[int, ...], apart: bool) -> None:
        """One checkpoint for the ``workers`` (global ranks; this one ``rank``), written
        by the first (``restart.mode: in_place``); only the writer takes the saved
        random-number states (the others keep their own). Workers ``apart`` (each at
        its own pace: the parameter-server strategies) resume each at its own data
        position, kept in the checkpoint as the store has it; the others, which meet
        every round, at the writer's. Every other worker keeps its own part beside the
        writer's file (:mod:`dmlctl.runtime.own_checkpoint`) and resumes its own
        model, optimizer, strategy state and RNGs from it (the parameter-server
        workers: all but the model, which the servers hold)."""
        self._rank, self._workers, self._apart = rank, workers, apart
        if self._manager is not None and not self._manager.writes:
            self._part = OwnPart.beside(self._manager, rank)

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
        if self._workers:
            step, state = self._own(step, state)
        if sharded is not None:
            from dmlctl.runtime.checkpoint_sharded import restore_small_state

            restore_small_state(state, model, optimizer)
        else:
            ckpt.restore_training_state(state, model, optimizer)
        self._cursor.resume_at = (int(state["data"]["epoch"]), int(state["data"]["batches"]))
        return step, dict(state.get("extra", {}))

    def _positions(self, step: int, mine: dict[str, int]) -> dict[str, list[int]]:
        """Every worker's data position — epoch, batches of it, steps in all: this one's
        (``mine``, at ``step``), the others' as they last copied them to the run's
        store."""
        out = {str(self._rank): [mine["epoch"], mine["batches"], step]}
        for rank in self._workers:
            if rank != self._rank and (at := rejoin.mirrored_position(rank)) is not None:
                out[str(rank)] = list(at)
        return out

    def _own(self, step: int, state: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A shared checkpoint (saved at ``step``) as this worker resumes from it
        (:meth:`share`): its own position and step count when the writer knew them,
        and its own part when it kept one (see :mod:`dmlctl.runtime.own_checkpoint`;
        a line on stderr says when it is not the agreed step's, or when there is none
        and it takes the writer's state without its RNGs)."""
        at = state.get("positions", {}).get(str(self._rank))
        if at is not None:
            state = {**state, "data": {"epoch": at[0], "batches": at[1]}}
            step = int(at[2])
        if self._part is None:  # the writer
            return step, state
        if self._apart:  # its newest: the store's copy of its position may be older
            mine = self._part.load(None)
        elif (exact := self._part.load(step)) is not None:
            return step, exact[1]
        else:
            mine = self._part.load(step, at_most=True)
        if mine is None:
            self._say(
                f"no checkpoint part of its own at step {step}; it takes the first "
                "worker's optimizer and strategy state"
            )
            return step, {**state, "rng": {}}
        if not self._apart:
            self._say(
                f"no checkpoint part of its own at step {step}; it takes its "
                f"optimizer and strategy state from its part of step {mine[0]}"
            )
        return step, {**state, **{k: mine[1][k] for k in _OWN_KEYS if k in mine[1]}}

    def _say(self, message: str) -> None:
        print(f"dmlctl rank {self._rank}: {message}", file=sys.stderr, flush=True)

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any],
    ) -> str | None:
        """Save after ``step`` completed steps when due, with ``extra``; the directory,
        or None (not due, no checkpoints here, or this worker's own part). Collective."""
        at = {"epoch": self._cursor.epoch, "batches": self._cursor.batches}
        if self._part is not None:
            if self._part.due(step):
                state = ckpt.training_state(model, optimizer, **at, extra=extra)
                with TRACKER.phase("checkpoint"):
                    self._part.save(step, state)
            return None
        if self._manager is None or not self._manager.due(step):
            return None
        sharded = self._sharded()
        if sharded is not None:  # shards through DCP
            from dmlctl.runtime.checkpoint_sharded import small_state

            sharded.bind(model, optimizer)
            state = small_state(optimizer, lambda: ckpt.rank_state(model, **at, extra=extra))
        else:
            state = ckpt.training_state(model, optimizer, **at, extra=extra)
        if self._apart:
            state["positions"] = self._positions(step, at)
        with TRACKER.phase("checkpoint"):
            directory = self._manager.save(step, state)
        if self._manager.committed_here:
            self._metrics.checkpoint(step, directory)
        return directory
