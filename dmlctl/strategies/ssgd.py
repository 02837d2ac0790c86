"""Synchronous SGD: gradients are averaged over all workers every step (PyTorch DDP).

Every worker holds a full replica; ``loss.backward()`` all-reduces gradients in
buckets, overlapping communication with the backward pass, so after
``optimizer.step()`` every replica holds the same parameters. This is exactly
single-process SGD on the union of the workers' batches.

Importing this module is cheap: it never imports torch (the control plane imports it
to validate a job's ``strategy.params``); torch is imported inside :func:`prepare`.
"""

from __future__ import annotations

import gc
import inspect
import weakref
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from dmlctl.runtime.context import Context

ROLES: tuple[str, ...] = ("worker",)


class Params(BaseModel):
    """``strategy.params`` of an ``ssgd`` job (all optional; unknown keys are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket_cap_mb: float = Field(
        default=25.0,
        gt=0,
        description="Gradient bucket size in MiB: smaller buckets start all-reduces "
        "earlier during backward, larger ones send fewer messages.",
    )
    find_unused_parameters: bool = Field(
        default=False,
        description="Set when some parameters get no gradient in a step (conditional "
        "branches); costs a graph traversal every step.",
    )
    gradient_as_bucket_view: bool = Field(
        default=True,
        description="Let .grad tensors alias the communication buckets: saves one copy "
        "and the memory of one gradient set.",
    )
    broadcast_buffers: bool = Field(
        default=True,
        description="Copy rank 0's buffers (e.g. BatchNorm running stats) to every "
        "worker at the start of each forward. Buffers are synced once at wrap time "
        "either way.",
    )


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Wrap ``model`` in DistributedDataParallel when the run has more than one worker.

    Promises: at world size 1 both objects come back unchanged. Otherwise the model
    comes back wrapped (parameters broadcast from rank 0, so every rank starts
    identical) and the optimizer comes back unchanged: DDP shares the module's
    parameters, so an optimizer built on ``model.parameters()`` before wrapping keeps
    working. ``model`` must already be on ``ctx.device``.
    """
    p = params if isinstance(params, Params) else Params.model_validate(params.model_dump())
    if ctx.world_size == 1:
        return model, optimizer

    from torch.nn.parallel import DistributedDataParallel

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
    wrapped = DistributedDataParallel(model, device_ids=device_ids, **kwargs)
    ref = weakref.ref(wrapped)
    ctx.on_close(lambda: _release(ref))
    return wrapped, optimizer


def _release(ref: weakref.ref[DistributedDataParallel]) -> None:
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
