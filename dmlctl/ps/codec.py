"""Encoded parameter-server pushes (runtime side, torch).

A job's ``push_compression`` (``int8``, ``topk``, ``sign`` or ``threshold``, see
:mod:`dmlctl.runtime.filters`) travels to every rank in the layout. The worker's
channel encodes each shard's flat update before it is sent, with **error feedback**:
what the encoding drops is kept per shard and added to that shard's next push, so
nothing is lost, only delayed. The server's channel receives exactly the encoded
bytes (the push's header says how many: a ``threshold`` push's size varies) and
decodes them, so the update rules see a float tensor as before. Pulls are not encoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dmlctl.runtime.filters import FilterState, decode, encode, filter_bytes


class PushCodec:
    """The push filter ``spec`` (``{"kind": …, "density": …, "threshold": …}``) over
    shards whose tensors have ``sizes[shard]`` elements each."""

    def __init__(self, spec: Mapping[str, Any], sizes: Sequence[Sequence[int]]) -> None:
        self.state = FilterState(
            str(spec["kind"]),
            density=float(spec.get("density", 0.01)),
            threshold=float(spec.get("threshold", 0.01)),
            error_feedback=True,
        )
        self.sizes = [list(s) for s in sizes]

    @property
    def kind(self) -> str:
        return self.state.kind

    @property
    def needs_reference(self) -> bool:
        """Whether :meth:`encode` needs the shard's parameters (``threshold``)."""
        return self.kind == "threshold"

    def nbytes(self, shard_id: int) -> int:
        """Bytes of an encoded push of ``shard_id`` (``threshold``: the most it takes)."""
        sizes = self.sizes[shard_id]
        return filter_bytes(self.kind, sum(sizes), self.state.density, len(sizes))

    def encode(
        self, shard_id: int, flat: torch.Tensor, reference: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The bytes to send for ``flat`` plus the shard's carried error; keeps the
        new error. ``reference``: the shard's parameters (``threshold`` measures each
        tensor's change against their norm). An empty shard encodes to nothing."""
        if flat.numel() == 0:
            return torch.empty(0, dtype=torch.uint8)
        value = flat.detach().to(torch.float32).reshape(-1)
        carried = self.state.error.get(shard_id)
        if carried is not None:
            value = value + carried
        payload, sent = encode(self.state, value, self.sizes[shard_id], reference)
        self.state.error[shard_id] = value - sent
        return payload

    def decode(self, shard_id: int, payload: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The update ``payload`` encodes, as ``dtype``."""
        if not self.sizes[shard_id] or sum(self.sizes[shard_id]) == 0:
            return torch.empty(0, dtype=dtype)
        return decode(self.state, payload, self.sizes[shard_id]).to(dtype)

    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state)
