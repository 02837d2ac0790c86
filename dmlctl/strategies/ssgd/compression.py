"""Gradient compression for ``ssgd``: DDP comm hooks behind a metering hook.

:func:`install` registers one of PyTorch's own hooks on a :class:`MeteredDDP`:

* ``none`` — ``default_hooks.allreduce_hook`` (the bucket, as is);
* ``fp16`` / ``bf16`` — ``default_hooks.fp16_compress_hook`` / ``bf16_compress_hook``
  (the bucket cast to 16 bits, all-reduced, cast back);
* ``powersgd`` — ``powerSGD_hook.powerSGD_hook`` with a ``PowerSGDState`` (rank-r
  factors P, Q of every matrix worth compressing; vanilla all-reduce for the first
  ``start_powerSGD_iter`` steps);
* ``int8`` / ``topk`` / ``sign`` — :func:`dmlctl.runtime.filters.filter_hook`
  with a :class:`~dmlctl.runtime.filters.FilterState` (quantization and
  sparsification, with error feedback for topk and sign).

Every hook is wrapped by :func:`metered_hook`, which feeds a
:class:`~dmlctl.runtime.optimizer.CommMeter`:

* **bytes** — what this worker contributes to all-reduces per step (one step = one
  backward that synchronises, counted at the bucket DDP processes last). ``none``:
  the bucket's bytes; ``fp16``/``bf16``: its element count × 2; ``powersgd`` before
  compression starts: the bucket's bytes; afterwards the growth of the state's
  ``total_numel_after_compression`` during the call × the element size. That counter
  grows by n·m for every tensor sent as is (vectors, matrices not worth compressing)
  and by (n + m)·r for every compressed n×m matrix — exactly the lengths of the
  three all-reduced buffers (uncompressed tensors, P of n·r, Q of m·r).
  :func:`powersgd_elements` recomputes the same split from the bucket's shapes.
  ``int8``/``topk``/``sign``: the bytes of the encoded bucket this worker
  all-gathers (:func:`~dmlctl.runtime.filters.filter_bytes`).
* **time** — from the hook's entry to the completion of its future (``fut.then``),
  so it includes compressing and decompressing; overlapping buckets count once
  (union of intervals). ``comm_share`` = that time / wall time of the window.

Only imported on the hosts (it imports torch), from :func:`dmlctl.strategies.ssgd.strategy.prepare`.
"""

import threading
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel

from dmlctl.runtime.filters import (
    FILTERS,
    FilterState,
    bucket_sizes,
    filter_bytes,
    filter_hook,
)
from dmlctl.runtime.optimizer import CommMeter

Hook = Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]


def powersgd_elements(
    shapes: list[torch.Size], rank: int, min_compression_rate: float
) -> tuple[int, int, int]:
    """(uncompressed, P, Q) element counts ``powerSGD_hook`` all-reduces for a bucket
    holding tensors of ``shapes`` (its rule: an n×m view is compressed when
    (n + m)·r·rate < n·m, with r = min(n, m, rank))."""
    plain = ps = qs = 0
    for shape in shapes:
        n = shape[0]
        m = int(torch.Size(shape).numel()) // n
        r = min(n, m, rank)
        if (n + m) * r * min_compression_rate < n * m:
            ps, qs = ps + n * r, qs + m * r
        else:
            plain += n * m
    return plain, ps, qs


class HookState:
    """What :func:`metered_hook` gets as its state: the wrapped hook, its own state
    and the meter. Updated from gloo's threads, hence the lock."""

    def __init__(self, compression: str, inner: Hook, inner_state: Any) -> None:
        self.compression = compression
        self.inner = inner
        self.inner_state = inner_state
        self.meter = CommMeter()
        self.lock = threading.Lock()
        self._busy_until = 0.0

    def record(self, nbytes: int, start: float, end: float) -> None:
        """Add one hook call's bytes and the part of [start, end] not yet counted."""
        with self.lock:
            seconds = max(0.0, end - max(start, self._busy_until))
            self._busy_until = max(self._busy_until, end)
            self.meter.add(nbytes, seconds)

    def bytes_before(self, bucket: GradBucket) -> int:
        """Bytes the call about to run will send, when known before it runs (-1: after)."""
        buffer = bucket.buffer()
        if self.compression in ("fp16", "bf16"):
            return int(buffer.numel()) * 2
        if isinstance(self.inner_state, FilterState):
            tensors = len(bucket_sizes(bucket))
            return filter_bytes(self.compression, buffer.numel(), self.inner_state.density, tensors)
        state = self.inner_state
        if isinstance(state, psgd.PowerSGDState) and state.iter >= state.start_powerSGD_iter:
            _drop_mismatched(state, bucket)
            return -1
        return int(buffer.numel() * buffer.element_size())


def metered_hook(state: HookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Run ``state.inner`` on ``bucket``, recording bytes sent and time to completion."""
    start = time.perf_counter()
    if bucket.is_last():
        with state.lock:
            state.meter.step()
    nbytes = state.bytes_before(bucket)
    psgd_state = state.inner_state
    before = getattr(psgd_state, "total_numel_after_compression", 0)
    fut = state.inner(psgd_state, bucket)
    if nbytes < 0:
        after = psgd_state.total_numel_after_compression
        nbytes = (after - before) * bucket.buffer().element_size()

    def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        state.record(nbytes, start, time.perf_counter())
        return f.value()

    return fut.then(done)


def _drop_mismatched(state: psgd.PowerSGDState, bucket: GradBucket) -> None:
    """Forget restored per-bucket buffers whose size no longer fits ``bucket`` (DDP
    laid out its buckets differently after a restart); they are rebuilt from zero."""
    index, length = bucket.index(), bucket.buffer().numel()
    plain, ps, qs = powersgd_elements(
        [g.shape for g in bucket.gradients()],
        state.matrix_approximation_rank,
        state.min_compression_rate,
    )
    del plain
    checks = ((state.error_dict, length), (state.p_memory_dict, ps), (state.q_memory_dict, qs))
    if any(index in d and d[index].numel() != n for d, n in checks):
        for d, _ in checks:
            d.pop(index, None)


class MeteredDDP(DistributedDataParallel):
    """DistributedDataParallel that reports its comm hook's traffic and carries the
    hook's state (PowerSGD's error feedback and warm-start factors).

    ``metrics()`` is merged into every ``ctx.log`` record. ``strategy_state()`` /
    ``load_strategy_state()`` hold what a checkpoint needs beyond the module's and
    the optimizer's ``state_dict`` (empty for ``none``/``fp16``/``bf16``).
    """

    hook_state: HookState | None = None

    def metrics(self) -> dict[str, float]:
        """``comm_bytes_per_step`` and ``comm_share`` since the previous call."""
        if self.hook_state is None:
            return {}
        with self.hook_state.lock:
            return self.hook_state.meter.metrics()

    def strategy_state(self) -> dict[str, Any]:
        """This rank's compression state: tensors and numbers only (loads with
        ``torch.load(weights_only=True)``). PowerSGD's error buffers differ per rank,
        so every rank saves its own."""
        hs = self.hook_state
        if hs is not None and isinstance(hs.inner_state, FilterState):
            return hs.inner_state.state_dict()
        if hs is None or not isinstance(hs.inner_state, psgd.PowerSGDState):
            return {}
        s = hs.inner_state
        _, keys, pos, has_gauss, gauss = cast("tuple[str, Any, int, int, float]", s.rng.get_state())
        return {
            "compression": "powersgd",
            "rank": s.matrix_approximation_rank,
            "iter": s.iter,
            "error": {k: v.detach().clone() for k, v in s.error_dict.items()},
            "p": {k: v.detach().clone() for k, v in s.p_memory_dict.items()},
            "q": {k: v.detach().clone() for k, v in s.q_memory_dict.items()},
            "numel_before": s.total_numel_before_compression,
            "numel_after": s.total_numel_after_compression,
            "rng_keys": torch.from_numpy(keys.astype(np.int64)),
            "rng_pos": int(pos),
            "rng_has_gauss": int(has_gauss),
            "rng_gauss": float(gauss),
        }

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`strategy_state` returned (call after ``ctx.prepare``,
        before the first step). Raises ``ValueError`` when the state belongs to
        another compression or PowerSGD rank."""
        hs = self.hook_state
        target = hs.inner_state if hs is not None else None
        if isinstance(target, FilterState):
            if state:
                target.load_state_dict(state)
            return
        if not isinstance(target, psgd.PowerSGDState):
            if state:
                raise ValueError(
                    f"strategy state is {state.get('compression')!r}'s, but compression "
                    f"is {hs.compression if hs is not None else 'none'!r}"
                )
            return
        if state.get("compression") != "powersgd" or state["rank"] != (
            target.matrix_approximation_rank
        ):
            raise ValueError(
                f"strategy state is for {state.get('compression')!r} rank {state.get('rank')}, "
                f"not powersgd rank {target.matrix_approximation_rank}"
            )
        target.iter = int(state["iter"])
        target.error_dict = {int(k): v.clone() for k, v in state["error"].items()}
        target.p_memory_dict = {int(k): v.clone() for k, v in state["p"].items()}
        target.q_memory_dict = {int(k): v.clone() for k, v in state["q"].items()}
        target.total_numel_before_compression = int(state["numel_before"])
        target.total_numel_after_compression = int(state["numel_after"])
        keys = state["rng_keys"].numpy().astype(np.uint32)
        target.rng.set_state(
            ("MT19937", keys, state["rng_pos"], state["rng_has_gauss"], state["rng_gauss"])
        )


def install(
    model: MeteredDDP,
    compression: str,
    *,
    rank: int = 1,
    warmup_steps: int = 10,
    error_feedback: bool = True,
    min_compression_rate: float = 2.0,
    density: float = 0.01,
    stochastic: bool = False,
    seed: int = 0,
) -> HookState:
    """Register ``compression``'s hook (metered) on ``model`` and return its state
    (``density``, ``stochastic``: topk's and int8's settings; ``error_feedback``:
    PowerSGD's, topk's and sign's; ``seed``: int8's stochastic rounding)."""
    group = dist.group.WORLD
    inner: Hook
    inner_state: Any = group
    if compression == "none":
        inner = default_hooks.allreduce_hook
    elif compression == "fp16":
        inner = default_hooks.fp16_compress_hook
    elif compression == "bf16":
        inner = default_hooks.bf16_compress_hook
    elif compression == "powersgd":
        inner = psgd.powerSGD_hook
        inner_state = psgd.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=warmup_steps,
            min_compression_rate=min_compression_rate,
            use_error_feedback=error_feedback,
            warm_start=True,
        )
    elif compression in FILTERS:
        inner = filter_hook
        inner_state = FilterState(
            compression,
            density=density,
            stochastic=stochastic,
            error_feedback=error_feedback,
            seed=seed,
        )
    else:
        raise ValueError(f"unknown compression {compression!r}")
    state = HookState(compression, inner, inner_state)
    model.register_comm_hook(state, metered_hook)
    model.hook_state = state
    return state
