"""Synchronous SGD: gradients are averaged over all workers every step (PyTorch DDP).

Every worker holds a full replica; ``loss.backward()`` all-reduces gradients in
buckets, overlapping communication with the backward pass, so after
``optimizer.step()`` every replica holds the same parameters. This is exactly
single-process SGD on the union of the workers' batches.

``compression`` swaps the bucket all-reduce for one of PyTorch's DDP comm hooks
(fp16/bf16 casts, PowerSGD low-rank factors with error feedback); see
:mod:`dmlctl.strategies.compression`. With compression the returned model also
reports ``comm_bytes_per_step`` and ``comm_share`` and carries the hook's state
(``strategy_state()`` / ``load_strategy_state()``), which a checkpoint saves per rank.

Importing this module is cheap: it never imports torch (the control plane imports it
to validate a job's ``strategy.params``); torch is imported inside :func:`prepare`.
"""

from __future__ import annotations

import gc
import inspect
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, field_validator, model_validator

from dmlctl.strategies.params import MAX_LOW_RANK, MAX_STEPS, MAX_WEIGHT, PARAMS_CONFIG
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from dmlctl.runtime.context import Context

ROLES: tuple[str, ...] = ("worker",)
NEEDS_RUNTIME = False  # a plain torchrun script that builds its own DDP is ssgd already
COMPRESSIONS: tuple[str, ...] = ("none", "fp16", "bf16", "powersgd")
_POWERSGD_ONLY = (
    "powersgd_rank",
    "powersgd_warmup_steps",
    "powersgd_error_feedback",
    "powersgd_min_compression_rate",
)


class Params(BaseModel):
    """``strategy.params`` of an ``ssgd`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    bucket_cap_mb: float = Field(
        default=25.0,
        gt=0,
        le=65536,
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
    compression: str = Field(
        default="none",
        description="Gradient compression: none (float32 buckets), fp16 / bf16 (buckets "
        "cast to 16 bits: half the bytes) or powersgd (rank-r factors of each matrix).",
    )
    powersgd_rank: int = Field(
        default=1, ge=1, le=MAX_LOW_RANK, description="PowerSGD matrix approximation rank r."
    )
    powersgd_warmup_steps: int = Field(
        le=MAX_STEPS,
        default=10,
        description="Steps of plain all-reduce before PowerSGD starts (start_powerSGD_iter); "
        "at least 2.",
    )
    powersgd_error_feedback: bool = Field(
        default=True,
        description="Add each step's compression error to the next step's gradient.",
    )
    powersgd_min_compression_rate: float = Field(
        default=2.0,
        gt=0,
        le=MAX_WEIGHT,
        description="Compress an n×m matrix only when n·m > (n + m)·r·rate; others are "
        "all-reduced as is.",
    )

    @field_validator("compression")
    @classmethod
    def _known_compression(cls, value: str) -> str:
        if value not in COMPRESSIONS:
            raise ValueError(f"unknown compression {value!r}; valid: {', '.join(COMPRESSIONS)}")
        return value

    @field_validator("powersgd_warmup_steps")
    @classmethod
    def _warmup_at_least_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError(
                f"powersgd_warmup_steps must be >= 2, got {value}: torch's PowerSGD needs "
                "2 plain all-reduce steps (DDP rebuilds its buckets after the first step)"
            )
        return value

    @model_validator(mode="after")
    def _powersgd_params_need_powersgd(self) -> Params:
        stray = [k for k in _POWERSGD_ONLY if k in self.model_fields_set]
        if stray and self.compression != "powersgd":
            raise ValueError(
                f"{', '.join(stray)} only apply with compression: powersgd "
                f"(compression is {self.compression!r})"
            )
        return self


def needs_runtime(params: BaseModel) -> bool:
    """A plain DDP script is ssgd with its defaults; any parameter the job sets
    (compression, bucket size, …) only applies through ``ctx.prepare``."""
    return bool(params.model_fields_set)


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Wrap ``model`` in DistributedDataParallel when the run has more than one worker.

    Promises: at world size 1 both objects come back unchanged. Otherwise the model
    comes back wrapped (parameters broadcast from rank 0, so every rank starts
    identical) and the optimizer comes back unchanged: DDP shares the module's
    parameters, so an optimizer built on ``model.parameters()`` before wrapping keeps
    working. ``model`` must already be on ``ctx.device``. The wrapper is a
    :class:`~dmlctl.strategies.compression.MeteredDDP` with ``compression``'s hook
    registered (``none`` included, so bytes and comm share are always reported);
    compression is moot, and not applied, in a world of 1.
    """
    p = params_as(Params, params)
    if ctx.world_size == 1:
        return model, optimizer

    from torch.nn.parallel import DistributedDataParallel

    from dmlctl.strategies import compression

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
        wrapped, p.compression, rank=p.powersgd_rank, warmup_steps=p.powersgd_warmup_steps,
        error_feedback=p.powersgd_error_feedback,
        min_compression_rate=p.powersgd_min_compression_rate,
    )  # fmt: skip
    ref = weakref.ref(wrapped)
    ctx.on_close(lambda: _release(ref))
    return wrapped, optimizer


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
