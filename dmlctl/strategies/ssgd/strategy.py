"""Synchronous SGD: gradients are averaged over all workers every step (PyTorch DDP).

Every worker holds a full replica; ``loss.backward()`` all-reduces gradients in
buckets, overlapping communication with the backward pass, so after
``optimizer.step()`` every replica holds the same parameters. This is exactly
single-process SGD on the union of the workers' batches.

``compression`` swaps the bucket all-reduce for one of PyTorch's DDP comm hooks
(fp16/bf16 casts, PowerSGD low-rank factors with error feedback); see
:mod:`dmlctl.strategies.ssgd.compression`. With compression the returned model also
reports ``comm_bytes_per_step`` and ``comm_share`` and carries the hook's state
(``strategy_state()`` / ``load_strategy_state()``), which a checkpoint saves per rank.

The parameters are :mod:`dmlctl.strategies.ssgd.params`'s; this module imports torch
(hosts only).
"""

from __future__ import annotations

import gc
import inspect
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel
from torch.nn.parallel import DistributedDataParallel

from dmlctl.runtime import rejoin
from dmlctl.strategies.registry import params_as
from dmlctl.strategies.ssgd import compression
from dmlctl.strategies.ssgd.params import Params

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Wrap ``model`` in DistributedDataParallel when the run has more than one worker.

        Promises: at world size 1 both objects come back unchanged. Otherwise the model
        comes back wrapped (parameters broadcast from rank 0, so every rank starts
        identical) and the optimizer comes back unchanged: DDP shares the module's
        parameters, so an optimizer built on ``model.parameters()`` before wrapping keeps
        working. ``model`` must already be on ``ctx.device``. With ``broadcast_buffers`` (the
    default) the end of training copies rank 0's buffers once more (:func:`_sync_buffers`),
    so every worker ends with the same model, buffers included. The wrapper is a
        :class:`~dmlctl.strategies.ssgd.compression.MeteredDDP` with ``compression``'s hook
        registered (``none`` included, so bytes and comm share are always reported);
        compression is moot, and not applied, in a world of 1. With a device mesh
        (``parallelism:``) the model is laid out already and DDP is not used: see
        :func:`_on_mesh`; nor with ``restart.mode: in_place``, whose workers average
        over a group that outlives a lost one (:mod:`dmlctl.strategies.ssgd.in_place`).
    """
    p = params_as(Params, params)
    if ctx.world_size == 1:
        return model, optimizer
    if ctx.mesh is not None:
        return _on_mesh(ctx, model, optimizer, p)
    if rejoin.in_place():
        from dmlctl.strategies.ssgd import in_place

        return in_place.prepare(ctx, model, optimizer, p)
    kwargs: dict[str, Any] = {
        "bucket_cap_mb": p.bucket_cap_mb,
        "find_unused_parameters": p.find_unused_parameters,
        "gradient_as_bucket_view": p.gradient_as_bucket_view,
    }
    # torch >= 2.13 renamed broadcast_buffers (now deprecated, with a warning).
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        kwargs["forward_sync_buffers"] = p.broadcast_buffers
    else:
        kwargs["broadcast_buffers"] = p.broadcast_buffers
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    wrapped = compression.MeteredDDP(model, device_ids=device_ids, **kwargs)
    compression.install(
        wrapped,
        p.compression,
        rank=p.powersgd_rank,
        warmup_steps=p.powersgd_warmup_steps,
        error_feedback=(
            p.powersgd_error_feedback if p.compression == "powersgd" else p.error_feedback
        ),
        min_compression_rate=p.powersgd_min_compression_rate,
        density=p.topk_density,
        stochastic=p.int8_stochastic,
        seed=ctx.rank,
    )
    ref = weakref.ref(wrapped)
    ctx.on_close(lambda: _release(ref))
    if p.broadcast_buffers:
        ctx.on_data_end(lambda: _sync_buffers(model))
    return wrapped, optimizer


def _sync_buffers(model: torch.nn.Module) -> None:
    """Every worker ← rank 0's buffers, as DDP's next forward would copy them: the
    last forward updated each replica's BatchNorm statistics on its own batch, so
    without this the final models differ in their buffers. One broadcast per buffer
    (no arithmetic: a ``-inf`` mask or an integer table arrives as it was)."""
    for buffer in model.buffers():
        torch.distributed.broadcast(buffer.data, src=0)


def _on_mesh(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, p: Params
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """ssgd over a device mesh (the model already laid out by ``ctx.prepare``): the
    replicate dimension averages gradients (:class:`ReplicatedGrads`) unless FSDP2's
    hybrid sharding does it, or there is one replica."""
    if p.compression != "none":
        raise ValueError(
            f"ssgd compression {p.compression!r} works on DDP's buckets, which model "
            "parallelism does not use; remove compression or the parallelism block"
        )
    layout, mesh = ctx.layout, ctx.mesh
    assert layout is not None and mesh is not None
    if layout.dp_replicate == 1 or layout.dp_shard > 1:
        return model, optimizer
    from dmlctl.strategies.ssgd.replicate import ReplicatedGrads  # imports DTensor

    params = [q for q in model.parameters() if q.requires_grad]
    group = mesh.get_group("dp_replicate")
    return model, ReplicatedGrads(optimizer, params, world_size=ctx.world_size, group=group)


def _release(ref: Callable[[], DistributedDataParallel | None]) -> None:
    """Free DDP's reducer, and the gloo work objects it keeps, while Python is alive.

    Freed later, during interpreter shutdown, a work object's destructor may need the
    GIL on a gloo thread, and the process aborts ("terminate called without an active
    exception", pytorch/pytorch#190489). Runs from ``Context.close`` (atexit), so the
    wrapper cannot run forward afterwards; ``.module`` still holds the model.
    """
    wrapped = ref()
    if wrapped is None:
        return
    for name in ("reducer", "logger", "process_group"):
        wrapped.__dict__.pop(name, None)
    gc.collect()
