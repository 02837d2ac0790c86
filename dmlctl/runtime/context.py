"""The run context a training script gets from ``dmlctl.init()``.

Contract:

* **Where am I.** ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` are
  read as torchrun sets them (:mod:`dmlctl.runtime.env`). Without them (plain
  ``python train.py``) the script is rank 0 of a world of 1 and no process group is
  created. With a world larger than 1, ``init()`` joins the default process group
  through ``MASTER_ADDR``/``MASTER_PORT`` (``cpu:gloo,cuda:nccl`` when CUDA is
  available, else ``gloo``; the job's ``backend:`` overrides) unless the script
  already did. A worker's device is the GPU of its index among its host's workers
  when CUDA is available, else CPU; a parameter server computes on the CPU
  (:mod:`dmlctl.gpus`).
* **What am I.** The role comes from ``DMLCTL_ROLE`` (default ``worker``), the
  strategy from ``DMLCTL_STRATEGY`` (default ``ssgd``) and its parameters from
  ``DMLCTL_STRATEGY_PARAMS`` (JSON, default ``{}``), validated by the strategy's
  ``Params`` model before the process group is joined.
* **Idempotent.** ``init()`` called again returns the same :class:`Context`
  (its arguments are then ignored) until :meth:`Context.close`, which also runs at
  interpreter exit and destroys the process group this module created.
* **Same start everywhere.** ``seed`` seeds ``random`` and torch identically on
  every rank, so replicas are built identical; data order differs per rank through
  :meth:`Context.shard`.
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
  size), see :mod:`dmlctl.runtime.checkpoint`.
* **Parameter servers.** With a strategy that has a ``server`` role (asgd, ssp, …),
  ``init()`` finds every rank's role (:mod:`dmlctl.runtime.membership`). On a server rank it
  never returns: the rank serves until every worker is finished, then exits with
  code 0 — so the same script runs unchanged under ``ssgd`` and ``asgd``. On a worker,
  :attr:`Context.rank` / :attr:`Context.world_size` count *workers* only (data
  sharding, ``all_reduce_mean``, ``barrier`` and checkpoints involve workers only);
  :attr:`Context.global_rank` is the process-group rank.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from pydantic import BaseModel
from torch.distributed.device_mesh import DeviceMesh

from dmlctl.mesh import MeshLayout
from dmlctl.protocol import PROGRESS, ROLE_SERVER
from dmlctl.runtime import checkpoint as ckpt
from dmlctl.runtime import divergence, guards
from dmlctl.runtime.data import MapDataset, batches_per_epoch, shard_batches
from dmlctl.runtime.env import RunEnv
from dmlctl.runtime.membership import Membership
from dmlctl.runtime.metrics import MetricLogger, Scalar
from dmlctl.runtime.optimizer import StrategyOptimizer
from dmlctl.runtime.parallel.devmesh import data_parallel_place
from dmlctl.runtime.parallel.hints import reshape_hint
from dmlctl.runtime.progress import TRACKER
from dmlctl.runtime.straggler import paced, straggler_factor

if TYPE_CHECKING:
    from dmlctl.runtime.checkpoint_sharded import ShardedCheckpointManager

_THREAD_GRACE_S = 0.05

Prepare = Callable[
    ["Context", torch.nn.Module, torch.optim.Optimizer, BaseModel],
    tuple[torch.nn.Module, torch.optim.Optimizer],
]
"""A strategy's ``prepare(ctx, model, optimizer, params)``: the wrapped pair."""


class Context:
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
        self._env = env
        self._mesh = mesh
        self._prepare = prepare
        self._device = device
        self._owns_group = owns_group
        self._members = membership
        is_server = membership is not None and env.rank in membership.servers
        if membership is not None and not is_server:
            self._rank, self._world = membership.worker_index(env.rank), len(membership.workers)
        else:
            self._rank, self._world = env.rank, env.world_size
        # The data-parallel replica this worker belongs to: its pipeline stages and
        # tensor-parallel peers see the same batches.
        self._data_rank, self._data_world = self._rank, self._world
        if env.layout is not None and mesh is not None and not is_server:
            self._data_rank, self._data_world = data_parallel_place(env.layout, self._rank)
        self._group: Any = membership.group if membership is not None else None
        self._metrics = MetricLogger(env.rank, env.rank_dir, check=self._check_logged)
        self._optimizer: torch.optim.Optimizer | None = None
        self._sources: list[Callable[[], dict[str, float]]] = []
        self._epoch = 0
        self._closed = False
        self._on_close: list[Callable[[], None]] = []
        self._ckpt = (
            None
            if is_server
            else self._checkpoint_manager().from_env(
                self._rank,
                self._world,
                env.local_rank,
                group=self._group,
                src=membership.workers[0] if membership is not None else 0,
            )
        )
        self._resume_at: tuple[int, int] | None = None  # (epoch, batches consumed)
        self._batches = self._skip = 0  # batches yielded in this epoch / left to skip
        self.resumed_extra: dict[str, Any] = {}  # ``extra`` of the checkpoint resumed
        self._on_data_end: list[Callable[[], None]] = []
        self._notices: set[str] = set()
        self._plan: tuple[int, int] | None = None  # (batches per epoch, epochs) of shard()
        self.total_steps: int | None = None
        """Set by a script with a loop of its own: progress is then the logged step
        (plus one) over ``total_steps``; ``ctx.shard`` knows it from its epochs."""

    @property
    def rank(self) -> int:
        """This worker's rank among the training processes, ``0 .. world_size - 1``
        (the global rank, except with parameter servers: then the index among the
        workers)."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of training processes (workers; parameter servers not counted)."""
        return self._world

    @property
    def global_rank(self) -> int:
        """Rank in the default process group (servers included)."""
        return self._env.rank

    @property
    def membership(self) -> Membership | None:
        """Global ranks of workers and servers and the workers' group (None: no
        parameter servers in this run)."""
        return self._members

    @property
    def data_parallel_rank(self) -> int:
        """This worker's replica among the data-parallel replicas: :attr:`rank`, except
        under tensor or pipeline parallelism, where the ranks of one replica (which
        must see the same batches) share it. Shard data by it, not by :attr:`rank`."""
        return self._data_rank

    @property
    def data_parallel_size(self) -> int:
        """Number of data-parallel replicas: :attr:`world_size` divided by the
        tensor and pipeline degrees."""
        return self._data_world

    @property
    def layout(self) -> MeshLayout | None:
        """The job's ``parallelism:`` layout (None without one)."""
        return self._env.layout

    @property
    def parallelize_function(self) -> str | None:
        """The job's ``parallelize: FILE:FUNCTION`` (None without one)."""
        return self._env.parallelize

    @property
    def mesh(self) -> DeviceMesh | None:
        """The device mesh over the workers (None without a ``parallelism:`` block or
        in a world of 1); ``ctx.mesh["tp"]`` is this worker's tensor-parallel group."""
        return self._mesh

    @property
    def local_rank(self) -> int:
        """Rank among the processes on this host."""
        return self._env.local_rank

    @property
    def local_world_size(self) -> int:
        """Number of processes on this host."""
        return self._env.local_world_size

    @property
    def role(self) -> str:
        """``worker`` for training processes; strategies may define others (``server``)."""
        return self._env.role

    @property
    def device(self) -> torch.device:
        """Where this rank's model and batches live."""
        return self._device

    @property
    def strategy(self) -> str:
        """Registered name of the strategy in use."""
        return self._env.strategy

    @property
    def fsdp(self) -> bool:
        """Whether the strategy's data-parallel dimensions are FSDP2 shards (its
        capabilities say so: ssgd)."""
        return self._env.capabilities.fsdp

    @property
    def strategy_params(self) -> BaseModel:
        """The validated parameters of the strategy (its ``Params`` instance)."""
        return self._env.params

    @property
    def is_main(self) -> bool:
        """True on rank 0: the rank that prints, evaluates once, saves checkpoints."""
        return self._rank == 0 and self.role != ROLE_SERVER

    @property
    def epoch(self) -> int:
        """Epoch of the batch :meth:`shard` yielded last (0 before it starts)."""
        return self._epoch

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
        inputs, targets = inputs.to(self._device), targets.to(self._device)
        step = getattr(model, "train_step", None)
        with reshape_hint(self._tensor_degree()):
            if callable(step):
                return step(inputs, targets, loss_fn)  # type: ignore[no-any-return]
            loss = loss_fn(model(inputs), targets)
            torch.autograd.backward(loss)
        return loss.detach()

    def _tensor_degree(self) -> int:
        """The job's tensor-parallel degree (1 without a ``parallelism:`` block)."""
        layout = self._env.layout
        return 1 if layout is None else layout.tp

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
        inputs, targets = inputs.to(self._device), targets.to(self._device)
        step = getattr(model, "eval_step", None)
        with reshape_hint(self._tensor_degree()):
            if callable(step):
                return step(inputs, targets, loss_fn)  # type: ignore[no-any-return]
            with torch.no_grad():
                return loss_fn(model(inputs), targets).detach()

    def add_metrics_source(self, source: Callable[[], dict[str, float]]) -> None:
        """Merge ``source()`` into every :meth:`log` record (values the caller passes
        win). Strategies report ``comm_bytes_per_step``, ``comm_share`` and their own
        measures (``consensus``, residuals) this way."""
        self._sources.append(source)

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
        self._metrics.start_clock()
        self._skip = 0
        if len(dataset) > 0 and epochs > 0 and batch_size >= 1:
            per_epoch = batches_per_epoch(len(dataset), self._data_world, batch_size, drop_last)
            self._plan = (per_epoch, epochs) if per_epoch > 0 else None
        if self._resume_at is not None and self._resume_at[0] >= start_epoch:
            start_epoch, self._skip = self._resume_at
        self._resume_at = None
        # A strategy that decides which samples a worker takes (cyclades) supplies
        # its own iterator, with shard_batches' arguments.
        source = getattr(self._optimizer, "shard_batches", shard_batches)
        batches = source(
            dataset,
            rank=self._data_rank,
            world_size=self._data_world,
            batch_size=batch_size,
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            start_epoch=start_epoch,
            device=self._device,
            on_epoch=self._set_epoch,
            on_batch=self._count,
        )
        slow = straggler_factor(self._rank, self._world)  # workers only: servers never shard
        return self._ending(paced(itertools.islice(batches, self._skip, None), slow))

    def _ending(self, batches: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from batches
        finally:  # exhausted, or the loop broke out: no more steps for now
            TRACKER.data_end()
        self.finish()  # exhausted (a loop that broke out never gets here)

    def finish(self) -> None:
        """Training is over: every worker takes the model the strategy's algorithm
        defines (the average for local-sgd and dpsgd, the center for easgd, z for
        admm, the servers' model with parameter servers, …), so every rank holds the
        same parameters and rank 0's save is the algorithm's result (``final: local``
        in the strategy's params keeps each replica).

        The end of :meth:`shard`'s data does this by itself; call it after a loop of
        your own (a ``DataLoader``) or one that breaks out early. Collective over the
        workers; again without a training step in between: nothing."""
        TRACKER.data_end()
        for callback in list(self._on_data_end):
            callback()

    def on_data_end(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` in :meth:`finish` (at the end of :meth:`shard`'s data or
        when the script calls it). :meth:`prepare` registers the strategy's own."""
        self._on_data_end.append(callback)

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

    def _set_epoch(self, epoch: int) -> None:
        self._epoch, self._batches = epoch, 0

    def _count(self, samples: int) -> None:
        self._batches += 1
        TRACKER.step(batch=True)
        if self._skip:
            self._skip -= 1  # consumed before the checkpoint: not counted again
        else:
            self._metrics.count(samples)

    def _laid_out(self) -> bool:
        """Whether the job has a ``parallelism:`` block and this rank is on its mesh."""
        return self._env.layout is not None and self._mesh is not None

    def _checkpoint_manager(self) -> type[ckpt.CheckpointManager]:
        """The checkpoint manager class: DCP shards for a laid-out model (imported only
        then: torch.distributed.checkpoint takes seconds to import), else whole files."""
        if not self._laid_out():
            return ckpt.CheckpointManager
        from dmlctl.runtime.checkpoint_sharded import ShardedCheckpointManager

        return ShardedCheckpointManager

    def _sharded_checkpoints(self) -> ShardedCheckpointManager | None:
        """This rank's checkpoint manager when it saves through DCP, else None."""
        if self._ckpt is None or not self._laid_out():
            return None
        from dmlctl.runtime.checkpoint_sharded import ShardedCheckpointManager

        assert isinstance(self._ckpt, ShardedCheckpointManager)
        return self._ckpt

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Restore the newest checkpoint valid on every rank into ``model``,
        ``optimizer``, the strategy, the RNGs and the :meth:`shard` position; returns
        the step to continue from (0: nothing to resume, or no checkpoint dir).

        Collective. Call after :meth:`prepare`, before :meth:`shard`.
        """
        sharded = self._sharded_checkpoints()
        if sharded is not None:
            sharded.bind(model, optimizer)
        with TRACKER.phase("resume"):
            found = self._ckpt.load_latest() if self._ckpt is not None else None
            if found is not None and sharded is not None:
                sharded.load_shards(found[0])
        if found is None:
            return 0
        step, state = found
        if sharded is not None:
            from dmlctl.runtime.checkpoint_sharded import restore_small_state

            restore_small_state(state, model, optimizer)
        else:
            ckpt.restore_training_state(state, model, optimizer)
        self._resume_at = (int(state["data"]["epoch"]), int(state["data"]["batches"]))
        self.resumed_extra = dict(state.get("extra", {}))
        return step

    def checkpoint(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **extra: Any
    ) -> str | None:
        """Save after ``step`` completed steps when due (``DMLCTL_CHECKPOINT_EVERY_*``),
        with ``extra`` tensors/numbers; returns the directory or None. Collective."""
        if self._ckpt is None or not self._ckpt.due(step):
            return None
        sharded = self._sharded_checkpoints()
        if sharded is not None:  # shards through DCP
            from dmlctl.runtime.checkpoint_sharded import small_state

            sharded.bind(model, optimizer)
            state = small_state(
                model, optimizer, epoch=self._epoch, batches=self._batches, extra=extra
            )
        else:
            state = ckpt.training_state(
                model, optimizer, epoch=self._epoch, batches=self._batches, extra=extra
            )
        with TRACKER.phase("checkpoint"):
            directory = self._ckpt.save(step, state)
        if self._ckpt.committed_here:
            self._metrics.checkpoint(step, directory)
        return directory

    def log(self, step: int | None = None, **metrics: Any) -> int:
        """Record ``metrics`` (numbers or one-element tensors) for this rank.

        ``step`` defaults to the previous step + 1 (first: 0). When :meth:`shard`
        yielded samples since the previous call, ``samples_per_s`` (this rank's
        samples / elapsed wall time) is added unless given. Tensors become floats
        (one ``.item()`` each, no other synchronisation). Returns the step used.

        Raises :class:`~dmlctl.runtime.divergence.Diverged` (after writing the
        record) when a loss key's value is NaN or infinite.
        """
        for source in self._sources:
            metrics = {**source(), **metrics}
        if self._env.rank_dir is not None:  # for the controller; a plain run's line stays as it was
            metrics = {
                **metrics,
                **{k: v for k, v in self._progress(step).items() if k not in metrics},
            }
        TRACKER.step()
        return self._metrics.log(step, metrics)

    def _progress(self, step: int | None) -> dict[str, Any]:
        """``epoch`` and ``progress`` (0 to 1) for a record at ``step``: from
        ``total_steps`` when the script set it, else from :meth:`shard`'s epochs;
        nothing when neither is known."""
        if self.total_steps is not None and self.total_steps > 0:
            at = step if step is not None else self._metrics.next_step
            return {PROGRESS: min(1.0, max(0.0, (at + 1) / self.total_steps))}
        if self._plan is None:
            return {}
        per_epoch, epochs = self._plan
        done = self._epoch * per_epoch + self._batches
        return {"epoch": self._epoch, PROGRESS: min(1.0, done / (per_epoch * epochs))}

    def _check_logged(self, step: int, values: Mapping[str, Scalar]) -> None:
        """The divergence guard on one converted record (see :meth:`log`)."""
        divergence.check_logged(
            values, strategy=self._env.strategy, step=step, advice=self._divergence_advice
        )

    def _divergence_advice(self) -> str:
        optimizer = self._optimizer
        if isinstance(optimizer, StrategyOptimizer):
            return optimizer.divergence_advice()
        return divergence.hint(optimizer)

    def barrier(self) -> None:
        """Wait until every rank gets here (no-op in a world of 1)."""
        if self._world > 1:
            dist.barrier(group=self._group)

    def all_reduce_mean(self, value: float | torch.Tensor) -> float:
        """Mean of a scalar over all ranks, returned to every rank as a float.

        Collective: every rank must call it. Meant for evaluation metrics.
        """
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"expected a scalar, got shape {tuple(value.shape)}")
            tensor = value.detach().reshape(()).to(self._device, torch.float64)
        else:
            tensor = torch.tensor(float(value), dtype=torch.float64, device=self._device)
        if self._world > 1:
            tensor = tensor.clone()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._group)
            tensor /= self._world
        return float(tensor.item())

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` in :meth:`close`, before the process group goes away.

        For strategies: free communication state (e.g. DDP's reducer) while the
        interpreter is fully alive. Callbacks run last-registered first.
        """
        self._on_close.append(callback)

    def close(self) -> None:
        """Flush metrics, run :meth:`on_close` callbacks, destroy the process group.

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
