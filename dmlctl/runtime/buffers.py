"""Which of a model's buffers a strategy exchanges: the one rule every strategy follows.

A buffer is **exchanged** — averaged, mixed, gathered, sent in a final consensus, and
judged by the divergence guard — only when it can change in training: it is floating
point, and at the first exchange it is not bit-identical on every rank to what every
rank held at the start. BatchNorm's running statistics are the common case (each rank
saw other data). Everything else is **kept**: integer buffers (counters such as
``num_batches_tracked``, index tables) and constant floating-point buffers (an
additive attention mask of ``-inf``, a sinusoidal or rotary table). A kept buffer is
never averaged (``-inf - -inf`` would make it NaN), never judged (a ``-inf`` mask is not
a divergence), and ends bit-identical to where it started. Checkpoints hold every
buffer either way (they save the model's ``state_dict``).

The decision is taken once, at the first exchange: one all-reduce (MAX) and one
(MIN) of the candidates' bytes and a changed-flag per buffer, over the group the
strategy exchanges in. Every rank gets the same answer.

The control plane never imports this module (it imports torch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


class ExchangedBuffers:
    """A model's floating-point buffers, and (after :meth:`resolve`) those exchanged.

    Made when the strategy has wrapped the model (``Context.prepare``), after any
    broadcast that makes the ranks start equal: what the buffers hold then is "the
    start"."""

    def __init__(self, buffers: Sequence[torch.Tensor] = ()) -> None:
        self.candidates = [b for b in buffers if b.is_floating_point()]
        self._start = {id(b): b.detach().clone() for b in self.candidates}
        self._chosen: list[torch.Tensor] | None = None if self.candidates else []

    @classmethod
    def of(cls, model: torch.nn.Module) -> ExchangedBuffers:
        """The rule applied to ``model``'s buffers (each shared buffer once)."""
        return cls(list(model.buffers()))

    @property
    def resolved(self) -> bool:
        """Whether the first exchange has decided (nothing is left to decide)."""
        return self._chosen is not None

    def resolve(self, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
        """The buffers exchanged, in model order. The first call with candidates left
        is collective over ``group`` (every rank of it must call); later calls are
        free and return the same list."""
        if self._chosen is None:
            start = [_bytes(self._start[id(b)]) for b in self.candidates]
            self._chosen = _decide(self.candidates, start, group)
        return self._chosen

    def start(self, buffer: torch.Tensor) -> torch.Tensor:
        """A copy of what ``buffer`` (a candidate) held at the start."""
        return self._start[id(buffer)]

    def average(self, group: dist.ProcessGroup | None, size: int) -> torch.Tensor | None:
        """The buffers exchanged ← their mean over the ``size`` ranks of ``group`` (one
        all-reduce of their flat concatenation, which is returned; None when no buffer
        is exchanged). Collective over ``group``."""
        chosen = self.resolve(group)
        if not chosen:
            return None
        flat = torch.cat([b.detach().reshape(-1) for b in chosen])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        flat /= size
        offset = 0
        with torch.no_grad():
            for b in chosen:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()
        return flat


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 tensor (bit patterns: ``-inf`` equals
    ``-inf``, and a NaN equals the same NaN)."""
    local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard
    return local.detach().contiguous().reshape(-1).view(torch.uint8)


def _decide(
    candidates: Sequence[torch.Tensor],
    start: Sequence[torch.Tensor],
    group: dist.ProcessGroup | None,
) -> list[torch.Tensor]:
    """The candidates that changed since ``start`` on some rank or differ between
    ranks now (two all-reduces over ``group``)."""
    now = [_bytes(b) for b in candidates]
    changed = [0 if torch.equal(a, s) else 1 for a, s in zip(now, start, strict=True)]
    flags = torch.tensor(changed, dtype=torch.uint8, device=now[0].device)
    high = torch.cat([*now, flags])
    low = high.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    flags_at = high.numel() - len(now)  # the changed-flags follow the bytes
    chosen, offset = [], 0
    for i, (buffer, data) in enumerate(zip(candidates, now, strict=True)):
        part = slice(offset, offset + data.numel())
        offset += data.numel()
        if int(high[flags_at + i]) or not torch.equal(high[part], low[part]):
            chosen.append(buffer)
    return chosen
