"""Collectives and point-to-point traffic of CUDA tensors in a group that carries
them through gloo (``backend: gloo`` on GPU workers): gloo has no CUDA
``send``/``recv`` (a CUDA tensor there aborts the process, nothing to catch) and CUDA
forms of only some collectives, so such tensors go through CPU copies. Under NCCL and
for CPU tensors every function here is the plain call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def through_gloo(tensor: torch.Tensor, group: Any = None) -> bool:
    """Whether ``tensor`` is a CUDA tensor that ``group`` (default: the default group)
    would move through gloo."""
    if tensor.device.type != "cuda":
        return False
    return "nccl" not in str(dist.get_backend(group))


def exchange(
    sends: Sequence[tuple[torch.Tensor, int]],
    receives: Sequence[tuple[torch.Tensor, int]],
    group: Any = None,
) -> None:
    """Send each ``(tensor, peer)`` of ``sends`` and fill each ``(tensor, peer)`` of
    ``receives`` in one batch of point-to-point operations, waiting for all; CUDA
    tensors go through CPU copies where the group would use gloo."""
    tensors = [t for t, _ in (*sends, *receives)]
    staged = bool(tensors) and through_gloo(tensors[0], group)
    moved = [t.cpu() if staged else t for t in tensors]
    ops = [dist.P2POp(dist.isend, moved[i], peer, group) for i, (_, peer) in enumerate(sends)]
    ops += [
        dist.P2POp(dist.irecv, moved[len(sends) + i], peer, group)
        for i, (_, peer) in enumerate(receives)
    ]
    for work in dist.batch_isend_irecv(ops) if ops else ():
        work.wait()
    if staged:
        for (target, _), got in zip(receives, moved[len(sends) :], strict=True):
            target.copy_(got)


def all_gather(out: list[torch.Tensor], tensor: torch.Tensor, group: Any = None) -> None:
    """``dist.all_gather(out, tensor)``; a CUDA tensor in a gloo group goes through CPU
    copies."""
    if not through_gloo(tensor, group):
        dist.all_gather(out, tensor, group=group)
        return
    host = [torch.empty_like(t, device="cpu") for t in out]
    dist.all_gather(host, tensor.cpu(), group=group)
    for target, got in zip(out, host, strict=True):
        target.copy_(got)
