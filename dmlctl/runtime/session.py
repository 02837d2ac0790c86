"""Joining the run: :func:`init` builds the one :class:`~dmlctl.runtime.context.Context`
of this process, :func:`current` returns it again (what the context then offers:
:mod:`dmlctl.runtime.context`).

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
* **Parameter servers.** With a strategy that has a ``server`` role (asgd, ssp, …),
  ``init()`` finds every rank's role (:mod:`dmlctl.runtime.membership`). On a server rank it
  never returns: the rank serves until every worker is finished, then exits with
  code 0 — so the same script runs unchanged under ``ssgd`` and ``asgd``. On a worker,
  :attr:`Context.rank` / :attr:`Context.world_size` count *workers* only (data
  sharding, ``all_reduce_mean``, ``barrier`` and checkpoints involve workers only);
  :attr:`Context.global_rank` is the process-group rank.

:func:`init` reads the environment, joins the default process group when the world is
larger than 1, seeds every rank alike, finds the ranks' roles for a strategy with
parameter servers, builds the job's device mesh over the workers (every rank takes
part, servers too), and on a server rank serves and never returns. The device and
the backend are :mod:`dmlctl.runtime.devices`'s choice. It is where the
runtime meets the strategies: it resolves the job's strategy through the registry
and hands the context what it needs (the strategy's ``prepare``, the membership).
"""

from __future__ import annotations

import atexit
import os
import random
import weakref

import torch
import torch.distributed as dist

from dmlctl.protocol import ROLE_SERVER
from dmlctl.runtime import devices, guards, rejoin
from dmlctl.runtime.context import Context
from dmlctl.runtime.env import read_env
from dmlctl.runtime.membership import discover, rejoined
from dmlctl.runtime.parallel.devmesh import build_mesh
from dmlctl.runtime.progress import TRACKER
from dmlctl.strategies import registry

_current: Context | None = None


def init(*, backend: str | None = None, seed: int | None = 0) -> Context:
    """Join the run (once) and return its :class:`Context`; the contract is this
    module's docstring, what the context offers :mod:`dmlctl.runtime.context`'s.

    ``backend`` overrides the process-group backend; ``seed=None`` skips seeding.
    """
    global _current
    if _current is not None:
        return _current
    env = read_env(os.environ, registry.load)
    placed = devices.place(env, os.environ, on_gpu=registry.uses_gpus(env.strategy))
    device = placed.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns_group = False
    servers = ROLE_SERVER in registry.capabilities(env.strategy).roles
    replacing = rejoin.rejoining()  # a worker started again in place: the world has met
    if env.world_size > 1 and not dist.is_initialized() and not replacing:
        chosen = backend or placed.backend
        with guards.joining(env.rank, servers):
            dist.init_process_group(backend=chosen, rank=env.rank, world_size=env.world_size)
        owns_group = True
        if env.role == ROLE_SERVER:
            guards.check_joined(env.world_size, env.strategy)
    if seed is not None:
        random.seed(seed)
        torch.manual_seed(seed)
    membership = None
    if env.world_size > 1 and servers:
        membership = rejoined() if replacing else discover(env.role)
    device_mesh = None
    if env.layout is not None and env.world_size > 1:
        workers = membership.workers if membership is not None else range(env.world_size)
        device_mesh = build_mesh(env.layout, list(workers), device.type)
    module = registry.load_runtime(env.strategy)
    ctx = _current = Context(
        env,
        device=device,
        owns_group=owns_group,
        prepare=module.prepare,
        membership=membership,
        mesh=device_mesh,
    )
    if device.type == "cuda":
        ctx.add_metrics_source(lambda: gpu_memory(device))
    ctx.on_close(lambda: _forget(ctx))  # runs last: a later init() starts afresh
    atexit.register(_close_at_exit, weakref.ref(ctx))
    if env.role == ROLE_SERVER:
        _serve(ctx, module)
    return ctx


def gpu_memory(device: torch.device) -> dict[str, float]:
    """What PyTorch's allocator holds on ``device``: bytes allocated to tensors and
    bytes reserved (no synchronisation; the dashboard's ``GPU mem`` column)."""
    return {
        "gpu_mem_bytes": float(torch.cuda.memory_allocated(device)),
        "gpu_reserved_bytes": float(torch.cuda.memory_reserved(device)),
    }


def _forget(ctx: Context) -> None:
    """``ctx`` closed: no longer this process's context (a later ``init()`` starts
    afresh)."""
    global _current
    if _current is ctx:
        _current = None


def _close_at_exit(ref: weakref.ref[Context]) -> None:
    """Close the context at the interpreter's exit, if it is still alive: ``atexit``
    holds it weakly (a strong reference would keep a closed context, its model and
    process groups, for the life of a process that goes on: a notebook, a sweep that
    calls ``init()`` again)."""
    ctx = ref()
    if ctx is not None:
        ctx.close()


def _serve(ctx: Context, module: registry.RuntimeModule) -> None:
    """Run this server rank until the workers are finished, then end the process
    (``SystemExit(0)``; under dmlctl a server rank never runs the training script,
    see :mod:`dmlctl.runtime.entry`)."""
    serve = getattr(module, "serve", None)
    if ctx.membership is None or not callable(serve):
        raise RuntimeError(f"strategy {ctx.strategy!r} has no parameter server to run")
    TRACKER.serving()  # waiting for workers is a server's job, never a hang
    serve(ctx, ctx.strategy_params)
    ctx.close()
    raise SystemExit(0)


def current() -> Context:
    """The context :func:`init` returned; ``RuntimeError`` before ``init()``."""
    if _current is None:
        raise RuntimeError("no dmlctl context: call dmlctl.init() first")
    return _current
