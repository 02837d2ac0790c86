"""Push/pull messages between worker ranks and parameter-server ranks.

Two roles, two small classes, so the transport can be replaced later without touching
the server or the worker-side strategy:

* :class:`WorkerChannel` — a worker pushes gradients for shards, pulls fresh shard
  parameters, and says DONE.
* :class:`ServerChannel` — a server receives the next message from *any* worker and
  replies to pulls.

This module's implementation is ``torch.distributed`` point-to-point (gloo; no RPC).
Wire protocol (all messages of one (sender, receiver) pair arrive in order per tag):

* **Header**: int64 tensor ``[op, worker_rank, clock, shard_id, extra, size, lr]``, tag
  :data:`HEADER_TAG`, worker → server. The server receives headers with
  ``dist.recv(header, tag=HEADER_TAG)`` and no ``src``: gloo receives from any
  source and returns the sender's rank (checked against gloo in torch 2.13).
* **PUSH**: the header, then the shard's flat update (the shard's dtype, ``numel``
  elements; with a push filter its encoded bytes, ``size`` of them, see
  :mod:`dmlctl.ps.codec`) with tag :func:`push_tag`. The server applies it; with
  ``extra = 1`` it
  then treats the header as a PULL too (push and read in one step, see
  :meth:`WorkerChannel.push`).
* **PULL**: the header only. The server answers — at once, or for stale synchronous
  parallel once the slowest worker is close enough — with a reply header
  ``[PULL_REPLY, server_rank, version, shard_id, min_clock]`` (tag
  :func:`reply_header_tag`) and the shard's flat parameters (tag
  :func:`reply_payload_tag`). The worker posts both receives *before* it sends the
  PULL header, so the server's blocking sends always find a posted receive.
* **DONE**: the header only: this worker pushes nothing more for now (it no longer
  holds back stale-synchronous readers); a later PUSH revokes it.
* **CLOSE**: the header only: this worker sends nothing more at all.
* **SNAPSHOT**: the header only; the server answers with a header
  ``[SNAPSHOT_REPLY, server_rank, nbytes, -1, 0]`` (tag :data:`BLOB_HEADER_TAG`) and
  its state as ``nbytes`` uint8 (tag :data:`BLOB_TAG`).
* **RESTORE**: the header with ``extra = nbytes``, then the state as uint8 (tag
  :data:`BLOB_TAG`); the server answers with a SNAPSHOT_REPLY header of 0 bytes
  once it has loaded the state (an acknowledgement).

Empty shards (``numel == 0``) carry no payload message in either direction.
Several shards are pushed or pulled concurrently: every send and receive of a call
is posted with ``isend``/``irecv`` first, then all are waited on.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from dmlctl.ps.codec import PushCodec

HEADER_TAG = 0
HEADER_LEN = 7
NO_LR = float("nan")
"""The ``lr`` slot of a header that carries none."""
BLOB_HEADER_TAG = 1_000_001
BLOB_TAG = 1_000_002


class Op(enum.IntEnum):
    """Message kinds (the first element of a header)."""

    PUSH = 1
    PULL = 2
    DONE = 3
    PULL_REPLY = 4
    CLOSE = 5
    SNAPSHOT = 6
    SNAPSHOT_REPLY = 7
    RESTORE = 8


def push_tag(shard_id: int) -> int:
    """Tag of a PUSH payload for ``shard_id`` (distinct from every other tag)."""
    return 1 + 3 * shard_id


def reply_header_tag(shard_id: int) -> int:
    """Tag of the reply header the server sends for a PULL of ``shard_id``."""
    return 2 + 3 * shard_id


def reply_payload_tag(shard_id: int) -> int:
    """Tag of the flat parameters the server sends for a PULL of ``shard_id``."""
    return 3 + 3 * shard_id


def _wait_all(works: Sequence[dist.Work | None]) -> None:
    """Wait on every started operation (``None`` means this rank is not in the
    default group, which the channel never does)."""
    for work in works:
        if work is None:
            raise RuntimeError("point-to-point operation outside the process group")
        work.wait()


def _header(
    op: Op, rank: int, clock: int, shard_id: int, extra: int = 0, lr: float = NO_LR, size: int = 0
) -> torch.Tensor:
    """A header; ``lr`` travels as the bits of a float64 in the last slot, ``size`` is
    an encoded push's byte count."""
    bits = int(torch.tensor([lr], dtype=torch.float64).view(torch.int64).item())
    return torch.tensor([int(op), rank, clock, shard_id, extra, size, bits], dtype=torch.int64)


def _header_lr(header: torch.Tensor) -> float | None:
    """The learning rate a header carries (None: none)."""
    lr = float(header[-1:].view(torch.float64).item())
    return None if math.isnan(lr) else lr


@dataclass(frozen=True)
class Message:
    """One message a server received: ``payload`` is the flat update for PUSH, the
    state bytes (uint8) for RESTORE and ``None`` otherwise (``shard_id`` is -1 for
    the messages that name no shard)."""

    op: Op
    worker: int
    clock: int
    shard_id: int
    payload: torch.Tensor | None = None
    then_pull: bool = False  # a PUSH that asks for the shard back once applied
    lr: float | None = None  # the pushing worker's learning rate, when it sends one


@dataclass(frozen=True)
class Pulled:
    """A pulled shard: the server's ``version`` (updates applied so far), its flat
    parameters at that version, and the slowest unfinished worker's clock as that
    server saw it when it answered (``min_clock``)."""

    version: int
    flat: torch.Tensor
    min_clock: int = 0


class WorkerChannel:
    """The worker's end: push, pull, done.

    ``shard_servers[s]`` is the rank of the server that holds shard ``s`` and
    ``shard_numel[s]`` its number of elements; every shard has dtype ``dtype``.
    ``bytes_sent`` counts payload bytes this worker sent (headers excluded).
    """

    def __init__(
        self,
        rank: int,
        shard_servers: Sequence[int],
        shard_numel: Sequence[int],
        dtype: torch.dtype = torch.float32,
        codec: PushCodec | None = None,
    ) -> None:
        if len(shard_servers) != len(shard_numel):
            raise ValueError("shard_servers and shard_numel must have the same length")
        self.rank = rank
        self.shard_servers = list(shard_servers)
        self.shard_numel = list(shard_numel)
        self.dtype = dtype
        self.codec = codec  # encodes every push (the job's push_compression), or None
        self.bytes_sent = 0
        self.bytes_received = 0

    @property
    def servers(self) -> list[int]:
        """The distinct server ranks, sorted."""
        return sorted(set(self.shard_servers))

    def push(
        self,
        grads: Mapping[int, torch.Tensor],
        clock: int | Mapping[int, int],
        *,
        pull: bool = False,
        lr: float | None = None,
        references: Mapping[int, torch.Tensor] | None = None,
    ) -> dict[int, Pulled]:
        """Send the flat update ``grads[s]`` for each shard ``s`` to its server, all
        concurrently; returns once every send completed. Each update must have the
        shard's ``numel`` elements (it is flattened and cast to ``dtype``). Every
        header carries ``clock`` (or ``clock[s]``, one per shard) and ``lr`` when given
        (servers that run the worker's optimizer follow its schedule).
        ``references[s]``: shard ``s``'s flat parameters, for a push filter that
        measures changes against them (``threshold``)

        With ``pull``, each PUSH also asks for the shard back (header ``extra = 1``):
        the server queues that read the moment it applies the update, exactly as a
        PULL at ``clock`` arriving right then — no other push can slip in between —
        and this returns the replies like :meth:`pull`; else it returns ``{}``."""
        replies, works = self._post_replies(list(grads) if pull else [])
        keep: list[torch.Tensor] = []  # buffers must outlive their sends
        for shard_id, grad in grads.items():
            flat = grad.detach().reshape(-1).to(self.dtype).contiguous()
            if flat.numel() != self.shard_numel[shard_id]:
                raise ValueError(
                    f"shard {shard_id}: gradient has {flat.numel()} elements, "
                    f"expected {self.shard_numel[shard_id]}"
                )
            if self.codec is not None:
                ref = references.get(shard_id) if references is not None else None
                flat = self.codec.encode(shard_id, flat, ref)
            dst = self.shard_servers[shard_id]
            tick = clock if isinstance(clock, int) else clock[shard_id]
            rate = NO_LR if lr is None else lr
            size = flat.numel() * flat.element_size()
            header = _header(Op.PUSH, self.rank, tick, shard_id, int(pull), rate, size)
            keep += [header, flat]
            works.append(dist.isend(header, dst, tag=HEADER_TAG))
            if flat.numel():
                works.append(dist.isend(flat, dst, tag=push_tag(shard_id)))
                self.bytes_sent += flat.numel() * flat.element_size()
        _wait_all(works)
        return self._collect(replies)

    def pull(self, shard_ids: Sequence[int], clock: int) -> dict[int, Pulled]:
        """Fresh parameters of every shard in ``shard_ids``, all requested
        concurrently; the result maps shard id → :class:`Pulled`."""
        replies, works = self._post_replies(shard_ids)
        requests = [_header(Op.PULL, self.rank, clock, s) for s in shard_ids]
        for shard_id, request in zip(shard_ids, requests, strict=True):
            works.append(dist.isend(request, self.shard_servers[shard_id], tag=HEADER_TAG))
        _wait_all(works)
        return self._collect(replies)

    def _post_replies(
        self, shard_ids: Sequence[int]
    ) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], list[dist.Work | None]]:
        """Post the receives of the replies for ``shard_ids`` (before any request, so
        the server's blocking sends always find them)."""
        replies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        works = []
        for shard_id in shard_ids:
            src = self.shard_servers[shard_id]
            header = torch.empty(HEADER_LEN, dtype=torch.int64)
            flat = torch.empty(self.shard_numel[shard_id], dtype=self.dtype)
            replies[shard_id] = (header, flat)
            works.append(dist.irecv(header, src, tag=reply_header_tag(shard_id)))
            if flat.numel():
                works.append(dist.irecv(flat, src, tag=reply_payload_tag(shard_id)))
        return replies, works

    def _collect(
        self, replies: Mapping[int, tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[int, Pulled]:
        out: dict[int, Pulled] = {}
        for shard_id, (header, flat) in replies.items():
            op, _, version, got, min_clock, _, _ = (int(v) for v in header.tolist())
            if op != Op.PULL_REPLY or got != shard_id:
                raise RuntimeError(f"bad pull reply {header.tolist()} for shard {shard_id}")
            out[shard_id] = Pulled(version, flat, min_clock)
            self.bytes_received += flat.numel() * flat.element_size()
        return out

    def _tell_servers(self, op: Op, clock: int) -> None:
        headers = [_header(op, self.rank, clock, -1) for _ in self.servers]
        works = [
            dist.isend(h, server, tag=HEADER_TAG)
            for h, server in zip(headers, self.servers, strict=True)
        ]
        _wait_all(works)

    def done(self, clock: int) -> None:
        """Tell every server this worker pushes nothing more for now (a later push
        revokes it); stale-synchronous readers no longer wait for this worker."""
        self._tell_servers(Op.DONE, clock)

    def close(self, clock: int) -> None:
        """Tell every server this worker sends nothing more at all; a server ends
        its loop once every worker closed."""
        self._tell_servers(Op.CLOSE, clock)

    def snapshot(self, server: int) -> bytes:
        """The state of ``server`` (its :meth:`ParameterServer.state_dict`,
        serialized) at the moment it handles this request."""
        reply = torch.empty(HEADER_LEN, dtype=torch.int64)
        work = dist.irecv(reply, server, tag=BLOB_HEADER_TAG)
        request = _header(Op.SNAPSHOT, self.rank, 0, -1)
        _wait_all([dist.isend(request, server, tag=HEADER_TAG), work])
        nbytes = int(reply[2])
        blob = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            dist.recv(blob, server, tag=BLOB_TAG)
        return blob.numpy().tobytes()

    def restore(self, server: int, state: bytes) -> None:
        """Make ``server`` load ``state`` (as :meth:`snapshot` returned it); returns
        once the server acknowledged."""
        ack = torch.empty(HEADER_LEN, dtype=torch.int64)
        work = dist.irecv(ack, server, tag=BLOB_HEADER_TAG)
        blob = torch.frombuffer(bytearray(state), dtype=torch.uint8)
        request = _header(Op.RESTORE, self.rank, 0, -1, blob.numel())
        works = [dist.isend(request, server, tag=HEADER_TAG)]
        if blob.numel():
            works.append(dist.isend(blob, server, tag=BLOB_TAG))
        _wait_all([*works, work])


class ServerTransport(Protocol):
    """What :class:`~dmlctl.ps.server.ParameterServer` needs from its transport
    (:class:`ServerChannel` here; a test fake or another transport elsewhere)."""

    def receive(self) -> Message:
        """The next message from any worker (blocking)."""
        ...

    def reply(
        self, worker: int, shard_id: int, version: int, flat: torch.Tensor, min_clock: int = 0
    ) -> None:
        """Send shard ``shard_id``'s parameters at ``version`` to ``worker``."""
        ...

    def send_blob(self, worker: int, blob: bytes) -> None:
        """Send ``blob`` (a SNAPSHOT answer, or b"" to acknowledge a RESTORE)."""
        ...


class ServerChannel:
    """The server's end: receive the next message from any worker; reply to pulls.

    ``shard_numel`` maps the shard ids this server holds to their element counts.
    """

    def __init__(
        self,
        rank: int,
        shard_numel: Mapping[int, int],
        dtype: torch.dtype = torch.float32,
        codec: PushCodec | None = None,
    ) -> None:
        self.rank = rank
        self.shard_numel = dict(shard_numel)
        self.dtype = dtype
        self.codec = codec  # decodes every push (the job's push_compression), or None

    def receive(self) -> Message:
        """Block until a header arrives from any rank; for a PUSH also receive its
        payload from that rank. Raises :class:`RuntimeError` on an unknown op or a
        shard this server does not hold."""
        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        sender = dist.recv(header, tag=HEADER_TAG)
        raw_op, worker, clock, shard_id, extra, size, _ = (int(v) for v in header.tolist())
        try:
            op = Op(raw_op)
        except ValueError:
            raise RuntimeError(f"unknown op {raw_op} from rank {sender}") from None
        if worker != sender:
            raise RuntimeError(f"header names rank {worker} but came from rank {sender}")
        if op in (Op.DONE, Op.CLOSE, Op.SNAPSHOT):
            return Message(op, worker, clock, -1)
        if op is Op.RESTORE:
            blob = torch.empty(extra, dtype=torch.uint8)
            if extra:
                dist.recv(blob, sender, tag=BLOB_TAG)
            return Message(op, worker, clock, -1, blob)
        if shard_id not in self.shard_numel:
            raise RuntimeError(f"rank {sender} sent {op.name} for shard {shard_id}, not held here")
        if op is Op.PULL:
            return Message(op, worker, clock, shard_id)
        if op is not Op.PUSH:
            raise RuntimeError(f"unexpected op {op.name} from rank {sender}")
        if self.codec is not None and self.shard_numel[shard_id]:
            if not 0 < size <= self.codec.nbytes(shard_id):
                raise RuntimeError(f"rank {sender} pushed {size} bytes for shard {shard_id}")
            encoded = torch.empty(size, dtype=torch.uint8)
            dist.recv(encoded, sender, tag=push_tag(shard_id))
            payload = self.codec.decode(shard_id, encoded, self.dtype)
        else:
            payload = torch.empty(self.shard_numel[shard_id], dtype=self.dtype)
            if payload.numel():
                dist.recv(payload, sender, tag=push_tag(shard_id))
        lr = _header_lr(header)
        return Message(op, worker, clock, shard_id, payload, then_pull=extra == 1, lr=lr)

    def reply(
        self, worker: int, shard_id: int, version: int, flat: torch.Tensor, min_clock: int = 0
    ) -> None:
        """Send ``flat`` (the shard's parameters at ``version``) to ``worker``, which
        has already posted its receives (see the module docstring)."""
        header = _header(Op.PULL_REPLY, self.rank, version, shard_id, min_clock)
        dist.send(header, worker, tag=reply_header_tag(shard_id))
        if flat.numel():
            dist.send(flat.contiguous(), worker, tag=reply_payload_tag(shard_id))

    def send_blob(self, worker: int, blob: bytes) -> None:
        """Answer a SNAPSHOT (or acknowledge a RESTORE with ``b""``): a header with the
        size, then the bytes; ``worker`` has posted its header receive."""
        dist.send(_header(Op.SNAPSHOT_REPLY, self.rank, len(blob), -1), worker, tag=BLOB_HEADER_TAG)
        if blob:
            dist.send(torch.frombuffer(bytearray(blob), dtype=torch.uint8), worker, tag=BLOB_TAG)
