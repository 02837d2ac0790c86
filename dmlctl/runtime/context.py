"""The run context a training script gets from ``dmlctl.init()`` (how a process joins
the run, its rank, role and device: :mod:`dmlctl.runtime.session`).

:class:`Context` is a facade over parts with one job each: who the rank is
(:mod:`~dmlctl.runtime.identity`), its data cursor (:mod:`~dmlctl.runtime.cursor`), its
metric records (:mod:`~dmlctl.runtime.rank_log`), its checkpoints
(:mod:`~dmlctl.runtime.rank_checkpoints`), one batch's step
(:mod:`~dmlctl.runtime.steps`) and the workers' collectives
(:mod:`~dmlctl.runtime.worker_group`). Contract:

* **Metrics.** :meth:`Context.log` goes to ``rank-<R>.events.jsonl`` under
  ``DMLCTL_RANK_DIR`` when set, else to one printed line on rank 0
  (see :mod:`dmlctl.runtime.metrics`).
* **Divergence guard.** A logged loss (a key ``loss`` or ending in ``loss``) that is
  NaN or infinite raises :class:`~dmlctl.runtime.divergence.Diverged` from
  :meth:`Context.log`, after the record is written; strategies check their parameters
  after each communication round the same way (:mod:`dmlctl.runtime.divergence`).
* **One final model.** When :meth:`Context.shard`'s data ends, or the script calls
  :meth:`Context.finish`, every worker takes the model the strategy's algorithm
  defines (``final: local`` in its params opts out): rank 0's save is the result.
* **Checkpoints.** With ``DMLCTL_CHECKPOINT_DIR`` set, :meth:`Context.checkpoint` saves
  when due and :meth:`Context.resume` restores exactly (bit for bit at the same world
  size), see :mod:`dmlctl.runtime.checkpoint`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from pydantic import BaseModel
from torch.distributed.device_mesh import DeviceMesh

from dmlctl.runtime import divergence, guards, rejoin, steps
from dmlctl.runtime.cursor import DataCursor
from dmlctl.runtime.data import MapDataset, shard_batches
from dmlctl.runtime.env import RunEnv
from dmlctl.runtime.identity import RankIdentity
from dmlctl.runtime.membership import Membership
from dmlctl.runtime.metrics import MetricLogger
from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.runtime.progress import TRACKER
from dmlctl.runtime.rank_checkpoints import RankCheckpoints, checkpoint_manager
from dmlctl.runtime.rank_log import RankLog, divergence_check
from dmlctl.runtime.steps import LossFn
from dmlctl.runtime.straggler import paced, straggler_factor
from dmlctl.runtime.worker_group import WorkerGroup

_THREAD_GRACE_S = 0.05

Prepare = Callable[
    ["Context", torch.nn.Module, torch.optim.Optimizer, BaseModel],
    tuple[torch.nn.Module, torch.optim.Optimizer],
]
"""A strategy's ``prepare(ctx, model, optimizer, params)``: the wrapped pair."""


class Context(RankIdentity):
    """This process's place in the run, and the helpers that depend on it.

    Build it with ``init()``, not directly: the session resolves the strategy and
    passes its ``prepare`` (:data:`Prepare`) and, with parameter servers, the
    ``membership``. Every attribute is read-only except through the methods
    (``epoch`` follows :meth:`shard`).
    """

    def __init__(
        self,
        env: RunEnv,
        *,
        device: torch.device,
        owns_group: bool,
        prepare: Prepare,
        membership: Membership | None = None,
        mesh: DeviceMesh | None = None,
    ) -> None:
        super().__init__(env, device=device, membership=membership, mesh=mesh)
        self._prepare, self._owns_group, at = prepare, owns_group, self._at
        group = membership.group if membership is not None else None
        self._metrics = MetricLogger(
            env.rank, env.rank_dir, check=divergence_check(env.strategy, self._divergence_advice)
        )
        position = _position(env, at.is_server)
        self._cursor = DataCursor(self._metrics, position=position)
        store = rejoin.StoreGroup(at.rank, at.world, self._cursor.started) if position else None
        self._store_group = store  # restart.mode: in_place: the workers' collectives
        self._workers = WorkerGroup(group, at.world, device, store)
        self._optimizer: torch.optim.Optimizer | None = None
        self._log = RankLog(self._metrics, self._cursor, progress=env.rank_dir is not None)
        self._closed = False
        self._on_close: list[Callable[[], None]] = []
        workers = tuple(membership.workers) if membership is not None else tuple(range(at.world))
        manager = (
            None if at.is_server else checkpoint_manager(env, at, workers, group, self._laid_out())
        )
        self._checkpoints = RankCheckpoints(
            manager, laid_out=self._laid_out(), cursor=self._cursor, metrics=self._metrics
        )
        if rejoin.in_place():
            self._checkpoints.share(env.rank, workers, apart=membership is not None)
        self.resumed_extra: dict[str, Any] = {}  # ``extra`` of the checkpoint resumed
        self._notices: set[str] = set()
        self.total_steps: int | None = None
        """Set by a script with a loop of its own: progress is then the logged step
        (plus one) over ``total_steps``; ``ctx.shard`` knows it from its epochs."""

    @property
    def epoch(self) -> int:
        """Epoch of the batch :meth:`shard` yielded last (0 before it starts)."""
        return self._cursor.epoch

    @property
    def batches_taken(self) -> int:
        """Batches :meth:`shard` has yielded in all; in a worker started again in place
        (``restart.mode: in_place``) its predecessor's count included."""
        return self._cursor.taken

    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Move ``model`` to :attr:`device` and let the strategy wrap both objects.

        Build the optimizer on ``model.parameters()`` before calling this and use the
        returned pair afterwards. Moving keeps the parameter objects, so the
        optimizer still refers to them.
        """
        model = model.to(self._device)
        if self._laid_out():
            from dmlctl.runtime.parallel.apply import lay_out  # torch's parallel APIs

            model, optimizer = lay_out(self, model, optimizer)
        unwrapped = model
        model, optimizer = self._prepare(self, model, optimizer, self._env.params)
        if isinstance(optimizer, StrategyOptimizer):
            optimizer.bind_names(self._env.strategy, unwrapped)
            optimizer.keep_local = getattr(self._env.params, "final", None) == "local"
            self.on_data_end(optimizer.finish)
            if getattr(optimizer, "elastic", None) is not None:  # rounds with peers: over
                self.on_data_end(self._cursor.trained)
            if (group := self._store_group) is not None and not optimizer.keep_local:
                params = [p for g in optimizer.param_groups for p in g["params"]]
                self.on_data_end(lambda: rejoin.check_one_model(params, group))
        self._optimizer = optimizer
        guards.mark_prepared()
        self._metrics.prepared(self._env.strategy)
        for wrapped in (optimizer, model):
            source = getattr(wrapped, "metrics", None)
            if callable(source):
                self.add_metrics_source(source)
        return model, optimizer

    def train_step(
        self,
        model: torch.nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Forward and backward of one batch; returns its loss (detached) on every
        rank. ``loss_fn(model(inputs), targets).backward()``, except under pipeline
        parallelism, where a rank holds only some stages and the job's schedule runs
        every microbatch through them (the loss then comes from the last stage).
        Works under every layout, so one training loop fits them all. The batch is
        moved to :attr:`device` first (no copy when it is there already)."""
        return self._step(model, (inputs, targets), loss_fn, train=True)

    def eval_step(
        self,
        model: torch.nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """:meth:`train_step` without gradients: the batch's loss on every rank, under
        every layout (collective over a model-parallel replica: all its ranks call it).
        The batch is moved to :attr:`device` first."""
        return self._step(model, (inputs, targets), loss_fn, train=False)

    def _step(
        self,
        model: torch.nn.Module,
        batch: tuple[torch.Tensor, torch.Tensor],
        loss_fn: LossFn,
        *,
        train: bool,
    ) -> torch.Tensor:
        return steps.run_step(
            model,
            batch,
            loss_fn,
            device=self._device,
            tensor_degree=self._tensor_degree(),
            train=train,
        )

    def add_metrics_source(self, source: Callable[[], dict[str, float]]) -> None:
        """Merge ``source()`` into every :meth:`log` record (values the caller passes
        win). Strategies report ``comm_bytes_per_step``, ``comm_share`` and their own
        measures (``consensus``, residuals) this way."""
        self._log.add_source(source)

    def shard(
        self,
        dataset: MapDataset,
        *,
        batch_size: int,
        epochs: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        start_epoch: int = 0,
    ) -> Iterator[Any]:
        """Iterate over this rank's batches for epochs ``start_epoch .. epochs - 1``.

        ``batch_size`` is per rank. Batches are collated (a tensor dataset yields
        tuples of tensors) and already on :attr:`device`. :attr:`epoch` follows the
        iteration; the samples yielded are counted for the ``samples_per_s`` that
        :meth:`log` adds. See
        :func:`dmlctl.runtime.data.shard_batches` for the sharding promises (a
        strategy that plans which samples each worker takes replaces it: cyclades). After
        :meth:`resume` the first call continues at the saved position instead.
        """
        cursor = self._cursor
        start_epoch = cursor.begin(
            len(dataset), self._at.data_world, batch_size, epochs, drop_last, start_epoch
        )
        # A strategy that decides which samples a worker takes (cyclades) supplies
        # its own planner (dmlctl.runtime.data.BatchPlanner).
        batches = shard_batches(
            dataset,
            rank=self._at.data_rank,
            world_size=self._at.data_world,
            batch_size=batch_size,
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            start_epoch=start_epoch,
            device=self._device,
            on_epoch=cursor.set_epoch,
            on_batch=cursor.count,
            planner=getattr(self._optimizer, "batch_plan", None),
        )
        slow = straggler_factor(self._at.rank, self._at.world)  # workers only: servers never shard
        return cursor.ending(paced(itertools.islice(batches, cursor.skip, None), slow))

    def finish(self) -> None:
        """Training is over: every worker takes the model the strategy's algorithm
        defines (the average for local-sgd and dpsgd, the center for easgd, z for
        admm, the servers' model with parameter servers, …), so every rank holds the
        same parameters and rank 0's save is the algorithm's result (``final: local``
        in the strategy's params keeps each replica).

        The end of :meth:`shard`'s data does this by itself; call it after a loop of
        your own (a ``DataLoader``) or one that breaks out early. Collective over the
        workers; again without a training step in between: nothing."""
        self._cursor.end()

    def go_on_at(self, step: int) -> None:
        """For a strategy whose replacement (``restart.mode: in_place``) joined its
        peers at their ``step``: its data and :meth:`resume`'s answer go on there."""
        self._cursor.go_on_at(step)

    def on_data_end(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` in :meth:`finish` (at the end of :meth:`shard`'s data or
        when the script calls it). :meth:`prepare` registers the strategy's own."""
        self._cursor.on_end(callback)

    def notice(self, message: str) -> None:
        """Print ``message`` once per run, from the first worker only (a strategy
        saying what it does with the user's objects, e.g. replacing the optimizer)."""
        if self.is_main and message not in self._notices:
            self._notices.add(message)
            print(f"dmlctl: {message}", flush=True)

    def mark_progress(self) -> None:
        """Count one training step for the hang detector (the data iterator and
        :meth:`log` already do): for loops that use neither."""
        TRACKER.step(batch=True)

    def phase(self, name: str, limit: float | None = None) -> AbstractContextManager[None]:
        """``with ctx.phase("eval"): …`` — a long stretch without training steps
        (evaluation, compilation, a data download) that must not count as a hang.

        The hang detector judges steps only while they run: before the first batch and
        after the data ends it never expects any. Inside a phase it does not either,
        unless the phase runs past ``limit`` seconds — then the rank is reported hung
        (with its stack) like one whose steps stopped.
        """
        return TRACKER.phase(name, limit)

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Restore the newest checkpoint valid on every rank into ``model``,
        ``optimizer``, the strategy, the RNGs and the :meth:`shard` position; returns
        the step to continue from (0: nothing to resume, or no checkpoint dir). A
        worker started again in place (``restart.mode: in_place``) continues from the
        batches its predecessor took (its model comes from the servers or a live
        peer, never from a checkpoint); in such a run every worker of a new attempt
        resumes from the first worker's checkpoint, the only one saved.

        Collective. Call after :meth:`prepare`, before :meth:`shard`.
        """
        if rejoin.rejoining():
            return self._cursor.taken
        found = self._checkpoints.resume(model, optimizer)
        if found is None:
            return self._cursor.taken
        step, self.resumed_extra = found
        return step

    def checkpoint(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **extra: Any
    ) -> str | None:
        """Save after ``step`` completed steps when due (``DMLCTL_CHECKPOINT_EVERY_*``),
        with ``extra`` tensors/numbers; returns the directory or None. Collective."""
        return self._checkpoints.save(step, model, optimizer, extra)

    def log(self, step: int | None = None, **metrics: Any) -> int:
        """Record ``metrics`` (numbers or one-element tensors) for this rank.

        ``step`` defaults to the previous step + 1 (first: 0). When :meth:`shard`
        yielded samples since the previous call, ``samples_per_s`` (this rank's
        samples / elapsed wall time) is added unless given. Tensors become floats
        (one ``.item()`` each, no other synchronisation). Returns the step used.

        Raises :class:`~dmlctl.runtime.divergence.Diverged` (after writing the
        record) when a loss key's value is NaN or infinite.
        """
        return self._log.log(step, metrics, self.total_steps)

    def _divergence_advice(self) -> str:
        optimizer = self._optimizer
        if isinstance(optimizer, StrategyOptimizer):
            return optimizer.divergence_advice()
        return divergence.hint(optimizer)

    def barrier(self) -> None:
        """Wait until every rank gets here (no-op in a world of 1)."""
        self._workers.barrier()

    def all_reduce_mean(self, value: float | torch.Tensor) -> float:
        """Mean of a scalar over all ranks, returned to every rank as a float.

        Collective: every rank must call it. Meant for evaluation metrics.
        """
        return self._workers.mean(value)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` in :meth:`close`, before the process group goes away.

        For strategies: free communication state (e.g. DDP's reducer) while the
        interpreter is fully alive. Callbacks run last-registered first.
        """
        self._on_close.append(callback)

    def close(self) -> None:
        """End the metric records, run :meth:`on_close` callbacks, destroy the process group.

        Only a group this context created is destroyed. Idempotent; registered with
        ``atexit`` so a script need not call it. A later ``init()`` starts afresh.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._metrics.close()
            while self._on_close:
                self._on_close.pop()()
            self._cursor.close()
        finally:
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()
                # Give the group's worker threads the GIL once more: a gloo thread that
                # frees its last work object needs it, and one still waiting for it
                # when the interpreter finalizes aborts the process (see
                # dmlctl.strategies.ssgd.strategy._release; pytorch/pytorch#190489).
                time.sleep(_THREAD_GRACE_S)

    def __repr__(self) -> str:
        return (
            f"Context(rank={self.rank}, world_size={self.world_size}, role={self.role!r}, "
            f"global_rank={self.global_rank}, "
            f"device={self._device}, strategy={self.strategy!r})"
        )


def _position(env: RunEnv, server: bool) -> rejoin.Position | None:
    """Where a worker of a run that replaces lost workers in place keeps its data
    position (None otherwise); a replacement starts its data there."""
    if server or env.rank_dir is None or not rejoin.in_place():
        return None
    return rejoin.Position(env.rank_dir, env.rank)
