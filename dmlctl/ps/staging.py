"""Moving a GPU worker's tensors to and from the parameter servers (runtime side,
torch). The servers and their channel work on CPU tensors; a worker whose model is on
a GPU copies each push into pinned host memory once, on a side CUDA stream (the
trainer's next kernels run while it copies; the push waits for it, on the
communication thread with ``overlap: true``), and each pull back to its device once.
On a CPU worker both are the identity.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch


class Staging:
    """The copies between a worker's ``device`` and the CPU channel."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_gpu = device.type == "cuda"
        self._side: torch.cuda.Stream | None = None  # the copies' own stream

    def to_host(self, flats: Mapping[int, torch.Tensor]) -> tuple[dict[int, torch.Tensor], Ready]:
        """CPU copies of ``flats`` (each in freshly pinned memory, started without
        waiting) and what to call before reading them: the copies are complete when it
        returns. CPU tensors come back as they are."""
        if not self.on_gpu:
            return dict(flats), _ready
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self._side.wait_stream(torch.cuda.current_stream(self.device))  # the packing is done
        out = {}
        with torch.cuda.stream(self._side):
            for key, flat in flats.items():
                host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                out[key] = host.copy_(flat, non_blocking=True)
                flat.record_stream(self._side)  # not reused before the copy read it
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record()
        return out, done.synchronize

    def to_device(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` (pulled, on the CPU) on this worker's device."""
        if not self.on_gpu:
            return list(tensors)
        return [t.to(self.device, non_blocking=True) for t in tensors]


Ready = Callable[[], None]
"""Waits until staged copies may be read."""


def _ready() -> None:
    """Nothing to wait for (CPU tensors)."""
