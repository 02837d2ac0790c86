"""Push/pull messages between worker ranks and parameter-server ranks.

Two roles, two small classes, so the transport can be replaced without touching the
server or the worker-side strategy:

* :class:`WorkerChannel` — a worker pushes gradients for shards, pulls fresh shard
  parameters, and says DONE.
* :class:`ServerChannel` — a server receives the next message from *any* worker and
  replies to pulls.

The messages travel on TCP connections of the channel's own (:mod:`dmlctl.ps.frames`:
one connection per (worker, server), a server found through the run's store), not on
the torch.distributed group: a connection can end without breaking anybody else's.
Every message is one frame, a header ``(op, rank, clock, shard_id, extra, size, lr)``
and ``size`` payload bytes; the messages of one connection arrive in order.

* **HELLO**: a worker's first frame on a connection: its rank (see
  :mod:`dmlctl.ps.frames`, which also holds the kinds, :class:`Op`). The server's
  :meth:`ServerChannel.receive` returns it, and a **LEFT** message (never sent) when a
  worker's connection ends before its CLOSE: the worker died.
* **PUSH**: the shard's flat update as payload (the shard's dtype, ``numel``
  elements; with a push filter its encoded bytes, see :mod:`dmlctl.ps.codec`). The
  server applies it; with ``extra = 1`` it then treats the header as a PULL too (push
  and read in one step, see :meth:`WorkerChannel.push`).
* **PULL**: no payload. The server answers — at once, for stale synchronous
  parallel once the slowest worker is close enough, and for a *final* read
  (``extra = 1``, the end of a worker's data) once every worker said DONE — with
  ``PULL_REPLY``:
  ``clock`` = the shard's version, ``extra`` = the slowest unfinished worker's clock,
  the shard's flat parameters as payload.
* **DONE**: this worker pushes nothing more for now (it no longer holds back
  stale-synchronous readers); a later PUSH revokes it.
* **CLOSE**: this worker sends nothing more at all (its connections then end).
* **SNAPSHOT**: the server answers ``SNAPSHOT_REPLY`` with its state as payload.
* **RESTORE**: the state as payload; the server answers an empty ``SNAPSHOT_REPLY``
  once it has loaded it (an acknowledgement).

A server that dies makes its workers' calls raise
:class:`~dmlctl.ps.connection.ConnectionLost` naming it; what a LEFT worker means is the
server's to decide (:class:`~dmlctl.ps.server.ParameterServer`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from dmlctl.ps import frames
from dmlctl.ps.connection import NO_LR, Connection, ConnectionLost, Fields, Op
from dmlctl.runtime import rejoin

if TYPE_CHECKING:
    from dmlctl.ps.codec import PushCodec

__all__ = ["Message", "Op", "Pulled", "ServerChannel", "ServerTransport", "WorkerChannel"]


def _fields(
    op: Op, rank: int, clock: int, shard_id: int = -1, extra: int = 0, lr: float = NO_LR
) -> Fields:
    return (int(op), rank, clock, shard_id, extra, lr)


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
    final: bool = False  # a PULL answered only once every worker said DONE
    sent: int = 0  # HELLO: the pushes this worker's process sent this server before


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
    ``bytes_sent`` counts payload bytes this worker sent (headers excluded). The
    connection to a server is made at the first message for it.
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
        self.pushes_to: dict[int, int] = {}  # server rank → pushes sent it (HELLO says it)
        self.done_at: int | None = None  # the clock of a DONE no push revoked yet

    @property
    def servers(self) -> list[int]:
        """The distinct server ranks, sorted."""
        return sorted(set(self.shard_servers))

    def _conn(self, server: int) -> Connection:
        return frames.connection(self.rank, server, self.pushes_to.get(server, 0))

    def _send(self, server: int, fields: Fields, payload: torch.Tensor | None = None) -> None:
        """Send one frame to ``server``; to its replacement when its connection broke
        (:meth:`_reconnect`)."""
        try:
            self._conn(server).send(fields, payload)
        except ConnectionLost as exc:
            self._reconnect(server, exc).send(fields, payload)

    def _reconnect(self, server: int, lost: ConnectionLost) -> Connection:
        """The connection to ``server``'s replacement when servers are replaced in
        place (``restart.mode: in_place``), after which this worker's DONE, if it
        said one, is said again; re-raises ``lost`` otherwise. What the dead server
        had not answered is asked again by the caller."""
        if not rejoin.servers_replaced():
            raise lost
        conn = frames.reconnect(self.rank, server, self.pushes_to.get(server, 0))
        if self.done_at is not None:
            conn.send(_fields(Op.DONE, self.rank, self.done_at))
        return conn

    def push(
        self,
        grads: Mapping[int, torch.Tensor],
        clock: int | Mapping[int, int],
        *,
        pull: bool = False,
        lr: float | None = None,
        references: Mapping[int, torch.Tensor] | None = None,
    ) -> dict[int, Pulled]:
        """Send the flat update ``grads[s]`` for each shard ``s`` to its server;
        returns once every one is sent. Each update must have the shard's ``numel``
        elements (it is flattened and cast to ``dtype``). Every header carries
        ``clock`` (or ``clock[s]``, one per shard) and ``lr`` when given (servers that
        run the worker's optimizer follow its schedule). ``references[s]``: shard
        ``s``'s flat parameters, for a push filter that measures changes against them
        (``threshold``).

        With ``pull``, each PUSH also asks for the shard back (header ``extra = 1``):
        the server queues that read the moment it applies the update, exactly as a
        PULL at ``clock`` arriving right then — no other push can slip in between —
        and this returns the replies like :meth:`pull`; else it returns ``{}``."""
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
            tick = clock if isinstance(clock, int) else clock[shard_id]
            rate = NO_LR if lr is None else lr
            fields = _fields(Op.PUSH, self.rank, tick, shard_id, int(pull), rate)
            server = self.shard_servers[shard_id]
            self._send(server, fields, flat)
            self.pushes_to[server] = self.pushes_to.get(server, 0) + 1
            self.bytes_sent += flat.numel() * flat.element_size()
        self.done_at = None
        if not pull:
            return {}
        ticks = {s: clock if isinstance(clock, int) else clock[s] for s in grads}
        return self._collect(list(grads), lambda s: _fields(Op.PULL, self.rank, ticks[s], s))

    def pull(
        self, shard_ids: Sequence[int], clock: int, *, final: bool = False
    ) -> dict[int, Pulled]:
        """Fresh parameters of every shard in ``shard_ids``, all requested before any
        answer is read; the result maps shard id → :class:`Pulled`. A ``final`` read
        is answered once every worker said DONE (:meth:`done`): the end of the data,
        where the workers meet without a collective of their own."""

        def request(shard_id: int) -> Fields:
            return _fields(Op.PULL, self.rank, clock, shard_id, int(final))

        for shard_id in shard_ids:
            self._send(self.shard_servers[shard_id], request(shard_id))
        return self._collect(shard_ids, request)

    def _collect(
        self, shard_ids: Sequence[int], request: Callable[[int], Fields]
    ) -> dict[int, Pulled]:
        """Read the replies for ``shard_ids`` (from each server, in whatever order it
        answers them); a server lost meanwhile and replaced in place is sent
        ``request(shard)`` again for the shards it had not answered."""
        out: dict[int, Pulled] = {}
        for server in sorted({self.shard_servers[s] for s in shard_ids}):
            wanted = {s for s in shard_ids if self.shard_servers[s] == server}
            while wanted:
                try:
                    got, pulled = self._reply(self._conn(server), wanted)
                except ConnectionLost as exc:
                    conn = self._reconnect(server, exc)
                    for s in sorted(wanted):
                        conn.send(request(s))
                    continue
                out[got] = pulled
                wanted.discard(got)
        return out

    def _reply(self, conn: Connection, wanted: set[int]) -> tuple[int, Pulled]:
        """The next PULL_REPLY on ``conn``, for one of the ``wanted`` shards."""
        header = conn.read_header()
        if header is None:
            raise ConnectionLost(f"{conn.peer}: Connection closed by peer")
        op, _, version, got, min_clock, size, _ = header
        expected = self.shard_numel[got] * self.dtype.itemsize if got in wanted else -1
        if op != Op.PULL_REPLY or size != expected:
            raise RuntimeError(f"{conn.peer}: bad pull reply {header} for {wanted}")
        flat = torch.empty(self.shard_numel[got], dtype=self.dtype)
        if size:
            conn.read_into(flat)
        self.bytes_received += size
        return got, Pulled(version, flat, min_clock)

    def _tell_servers(self, op: Op, clock: int) -> None:
        for server in self.servers:
            self._send(server, _fields(op, self.rank, clock))

    def done(self, clock: int) -> None:
        """Tell every server this worker pushes nothing more for now (a later push
        revokes it); stale-synchronous readers no longer wait for this worker."""
        self.done_at = clock
        self._tell_servers(Op.DONE, clock)

    def close(self, clock: int) -> None:
        """Tell every server this worker sends nothing more at all, and end the
        connections; a server ends its loop once every worker closed (one replaced
        in place learns from the run's store who closed before it started)."""
        if rejoin.servers_replaced():  # with the pushes it sent each server
            sent = json.dumps({str(s): n for s, n in self.pushes_to.items()})
            rejoin.store().set(frames.closed_key(self.rank), sent)
        self._tell_servers(Op.CLOSE, clock)
        for server in self.servers:
            frames.disconnect(server)

    def snapshot(self, server: int) -> bytes:
        """The state of ``server`` (its :meth:`ParameterServer.state_dict`,
        serialized) at the moment it handles this request (asked of its replacement
        when it was lost meanwhile and is replaced in place)."""
        return self._blob(server, _fields(Op.SNAPSHOT, self.rank, 0)).numpy().tobytes()

    def restore(self, server: int, state: bytes) -> None:
        """Make ``server`` load ``state`` (as :meth:`snapshot` returned it); returns
        once the server acknowledged."""
        blob = torch.frombuffer(bytearray(state), dtype=torch.uint8) if state else None
        self._blob(server, _fields(Op.RESTORE, self.rank, 0), blob)

    def _blob(
        self, server: int, fields: Fields, payload: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``server``'s blob reply to ``fields`` (asked again of its replacement)."""
        try:
            conn = self._conn(server)
            conn.send(fields, payload)
            return self._blob_reply(conn)
        except ConnectionLost as exc:
            conn = self._reconnect(server, exc)
            conn.send(fields, payload)
            return self._blob_reply(conn)

    @staticmethod
    def _blob_reply(conn: Connection) -> torch.Tensor:
        header = conn.read_header()
        if header is None:
            raise ConnectionLost(f"{conn.peer}: Connection closed by peer")
        if header[0] != Op.SNAPSHOT_REPLY:
            raise RuntimeError(f"{conn.peer}: expected a snapshot reply, got {header}")
        return conn.payload(header[5])


class ServerTransport(Protocol):
    """What :class:`~dmlctl.ps.server.ParameterServer` needs from its transport
    (:class:`ServerChannel` here; a test fake or another transport elsewhere)."""

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message from any worker (blocking; None once ``timeout`` seconds
        passed without one)."""
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

    ``shard_numel`` maps the shard ids this server holds to their element counts. The
    connections are the process's :class:`~dmlctl.ps.frames.Endpoint`, made (and its
    address published) at the first message received.
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

    def receive(self, timeout: float | None = None) -> Message | None:
        """Block until a message arrives from any worker (None once ``timeout``
        seconds passed without one). A worker whose connection ended before its
        CLOSE is a LEFT message. Raises :class:`RuntimeError` on an unknown op, a
        header that names another rank, or a shard this server does not hold."""
        frame = frames.endpoint(self.rank).get(timeout)
        if frame is None:
            return None
        header, raw, sender = frame
        raw_op, worker, clock, shard_id, extra, _, lr = header
        try:
            op = Op(raw_op)
        except ValueError:
            raise RuntimeError(f"unknown op {raw_op} from rank {sender}") from None
        if worker != sender:
            raise RuntimeError(f"header names rank {worker} but came from rank {sender}")
        if op is Op.HELLO:
            return Message(op, worker, clock, -1, sent=extra)
        if op in (Op.DONE, Op.CLOSE, Op.SNAPSHOT, Op.LEFT):
            return Message(op, worker, clock, -1)
        if op is Op.RESTORE:
            return Message(op, worker, clock, -1, raw)
        if shard_id not in self.shard_numel:
            raise RuntimeError(f"rank {sender} sent {op.name} for shard {shard_id}, not held here")
        if op is Op.PULL:
            return Message(op, worker, clock, shard_id, final=extra == 1)
        if op is not Op.PUSH:
            raise RuntimeError(f"unexpected op {op.name} from rank {sender}")
        payload = self._decode(sender, shard_id, raw)
        rate = None if math.isnan(lr) else lr
        return Message(op, worker, clock, shard_id, payload, then_pull=extra == 1, lr=rate)

    def _decode(self, sender: int, shard_id: int, raw: torch.Tensor) -> torch.Tensor:
        """A PUSH payload as the shard's flat update (decoded by the push filter)."""
        numel = self.shard_numel[shard_id]
        if self.codec is not None and numel:
            if not 0 < raw.numel() <= self.codec.nbytes(shard_id):
                raise RuntimeError(f"rank {sender} pushed {raw.numel()} bytes for shard {shard_id}")
            return self.codec.decode(shard_id, raw, self.dtype)
        if raw.numel() != numel * self.dtype.itemsize:
            raise RuntimeError(f"rank {sender} pushed {raw.numel()} bytes for shard {shard_id}")
        return raw.view(self.dtype)

    def reply(
        self, worker: int, shard_id: int, version: int, flat: torch.Tensor, min_clock: int = 0
    ) -> None:
        """Send ``flat`` (the shard's parameters at ``version``) to ``worker``."""
        fields = _fields(Op.PULL_REPLY, self.rank, version, shard_id, min_clock)
        frames.endpoint(self.rank).send(worker, fields, flat)

    def send_blob(self, worker: int, blob: bytes) -> None:
        """Answer a SNAPSHOT (or acknowledge a RESTORE with ``b""``): the bytes as the
        payload of a SNAPSHOT_REPLY."""
        payload = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else None
        reply = _fields(Op.SNAPSHOT_REPLY, self.rank, len(blob))
        frames.endpoint(self.rank).send(worker, reply, payload)
