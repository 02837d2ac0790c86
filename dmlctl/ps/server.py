"""The parameter server: holds some shards' parameters and applies pushed gradients.

A shard is a flat 1-D tensor (the concatenation of the parameter tensors the shard
plan gave it, see :func:`pack` / :func:`unpack`). :class:`ParameterServer` keeps, per
shard, the parameters and a **version** (the number of updates applied so far); per
worker a **clock** (the largest clock that worker sent); and, per (worker, shard), the
version that worker last pulled.

Update rule (for now): plain SGD, applied to each pushed gradient as it arrives —
``flat.add_(grad, alpha=-lr)``, exactly what ``torch.optim.SGD`` does without momentum.

**Staleness** of an applied update = the shard's version just before it is applied
minus the version that worker last pulled of that shard (0 when it never pulled: the
worker started from the initial parameters). It is never negative. The server counts
the measured values in :attr:`ParameterServer.staleness_histogram`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from dmlctl.ps.channel import Message, Op, ServerTransport


def pack(tensors: Sequence[torch.Tensor], indices: Iterable[int]) -> torch.Tensor:
    """One new flat tensor: ``tensors[i]`` for ``i`` in ``indices``, in that order
    (an empty tensor of the first tensor's dtype, or float32, when ``indices`` is empty)."""
    parts = [tensors[i].detach().reshape(-1) for i in indices]
    if not parts:
        dtype = tensors[0].dtype if tensors else torch.float32
        return torch.empty(0, dtype=dtype)
    return torch.cat(parts)


def unpack(
    flats: Sequence[torch.Tensor], plan: Sequence[Sequence[int]], shapes: Sequence[torch.Size]
) -> list[torch.Tensor]:
    """Inverse of :func:`pack` over a whole plan: ``flats[k]`` holds the tensors
    ``plan[k]`` (in that order); returns the tensors in index order with ``shapes``.
    Raises :class:`ValueError` when a flat tensor's size does not match its shapes."""
    out: list[torch.Tensor | None] = [None] * len(shapes)
    for flat, shard in zip(flats, plan, strict=True):
        offset = 0
        for i in shard:
            n = shapes[i].numel()
            out[i] = flat[offset : offset + n].reshape(shapes[i])
            offset += n
        if offset != flat.numel():
            raise ValueError(f"flat shard has {flat.numel()} elements, plan says {offset}")
    missing = [i for i, t in enumerate(out) if t is None]
    if missing:
        raise ValueError(f"tensors {missing} are in no shard")
    return [t for t in out if t is not None]


class ParameterServer:
    """Serves the shards ``shards`` (shard id → flat parameters, copied) to the
    workers ``worker_ranks`` through ``channel`` with SGD learning rate ``lr``."""

    def __init__(
        self,
        shards: Mapping[int, torch.Tensor],
        worker_ranks: Iterable[int],
        channel: ServerTransport,
        *,
        lr: float,
    ) -> None:
        self.params: dict[int, torch.Tensor] = {
            s: t.detach().reshape(-1).clone() for s, t in shards.items()
        }
        self.workers = sorted(set(worker_ranks))
        self.channel = channel
        self.lr = lr
        self.versions: dict[int, int] = dict.fromkeys(self.params, 0)
        self.clocks: dict[int, int] = dict.fromkeys(self.workers, 0)
        self.pulled: dict[tuple[int, int], int] = {}
        self.staleness_histogram: dict[int, int] = {}
        self.finished: set[int] = set()

    # ----------------------------------------------------------------- messages

    def handle(self, msg: Message) -> None:
        """Apply one message: PUSH → SGD step on the shard (version + 1, staleness
        recorded); PULL → reply with the current parameters and remember the version
        the worker now has; DONE → mark the worker finished. Every message advances
        the worker's clock to ``max(clock, msg.clock)``. Raises :class:`RuntimeError`
        for a rank that is not one of this server's workers."""
        if msg.worker not in self.clocks:
            raise RuntimeError(f"message from rank {msg.worker}, not a worker of this server")
        self.clocks[msg.worker] = max(self.clocks[msg.worker], msg.clock)
        if msg.op is Op.DONE:
            self.finished.add(msg.worker)
        elif msg.op is Op.PULL:
            version = self.versions[msg.shard_id]
            self.pulled[(msg.worker, msg.shard_id)] = version
            self.channel.reply(msg.worker, msg.shard_id, version, self.params[msg.shard_id])
        elif msg.op is Op.PUSH:
            assert msg.payload is not None
            self.apply(msg.worker, msg.shard_id, msg.payload)
        else:
            raise RuntimeError(f"a server cannot handle {msg.op.name}")

    def apply(self, worker: int, shard_id: int, grad: torch.Tensor) -> int:
        """SGD step ``params[shard] -= lr * grad`` (as ``add_(grad, alpha=-lr)``);
        returns the measured staleness (>= 0) and counts it."""
        version = self.versions[shard_id]
        staleness = version - self.pulled.get((worker, shard_id), 0)
        self.params[shard_id].add_(grad.reshape(-1), alpha=-self.lr)
        self.versions[shard_id] = version + 1
        self.staleness_histogram[staleness] = self.staleness_histogram.get(staleness, 0) + 1
        return staleness

    def serve(self) -> None:
        """Receive and handle messages until every worker sent DONE."""
        while len(self.finished) < len(self.workers):
            self.handle(self.channel.receive())

    # ----------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: parameters (copies), versions, clocks, the
        versions each worker last pulled and the staleness histogram. Plain dicts,
        lists and tensors (``torch.save`` / ``weights_only`` loading works)."""
        return {
            "params": {s: t.clone() for s, t in self.params.items()},
            "versions": dict(self.versions),
            "clocks": dict(self.clocks),
            "pulled": [[w, s, v] for (w, s), v in sorted(self.pulled.items())],
            "staleness_histogram": dict(self.staleness_histogram),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. The shard ids and sizes must match this
        server's (raises :class:`ValueError` otherwise); the parameters are copied
        in place. Finished workers are not part of the state (a restored server waits
        for every worker's DONE again)."""
        params: Mapping[int, torch.Tensor] = state["params"]
        if set(params) != set(self.params):
            raise ValueError(f"state holds shards {sorted(params)}, server {sorted(self.params)}")
        for s, t in params.items():
            if t.numel() != self.params[s].numel():
                raise ValueError(
                    f"shard {s}: state has {t.numel()} elements, server {self.params[s].numel()}"
                )
        for s, t in params.items():
            self.params[s].copy_(t.reshape(-1))
        self.versions = {int(s): int(v) for s, v in state["versions"].items()}
        self.clocks = {int(w): int(c) for w, c in state["clocks"].items()}
        self.pulled = {(int(w), int(s)): int(v) for w, s, v in state["pulled"]}
        self.staleness_histogram = {int(k): int(v) for k, v in state["staleness_histogram"].items()}
        self.finished = set()
