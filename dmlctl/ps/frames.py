"""The parameter-server channel's own TCP connections: frames, and how the two ends
find each other.

Every message between a worker and a server is one **frame**: a fixed header of seven
numbers ``(op, rank, clock, shard_id, extra, size, lr)`` (six little-endian int64 and
a float64, :data:`HEADER`) followed by ``size`` payload bytes. A worker holds one
connection to each server; its first frame names it (``HELLO``). The connections are
the channel's own, not the torch.distributed group's, so that they can end and be
made again while the others go on.

A server listens on a port of its own and publishes ``host:port`` in the run's
torch.distributed store (the default group's :class:`torch.distributed.TCPStore`);
a worker reads it there (waiting until it is set). Which host address, and how a
connection to a silent host ends: :mod:`dmlctl.ps.addresses`.

Both ends live as long as the process group: a server process has one
:class:`Endpoint` (the listener, one reader thread per worker, one inbox) for all its
channels, a worker process one connection to each server; a new group starts them
afresh. A worker that connects again (a new process of its rank) replaces its old one.
"""

from __future__ import annotations

import contextlib
import enum
import queue
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from dmlctl.ps.addresses import advertised_host, keep_alive
from dmlctl.runtime import rejoin

HEADER = struct.Struct("<qqqqqqd")
"""op, rank, clock, shard_id, extra, size (payload bytes), lr (NaN: none)."""
MAX_PAYLOAD = 1 << 40
SUPERSEDED_POLL_S = 1.0
"""How often a waiting reader asks whether its peer was replaced (a store read)."""
"""A header announcing more payload bytes than this is corrupt."""
NO_LR = float("nan")
"""The ``lr`` slot of a header that carries none."""

Fields = tuple[int, int, int, int, int, float]
"""A frame's header as a sender gives it: op, rank, clock, shard_id, extra, lr (the
size is the payload's)."""


class Op(enum.IntEnum):
    """Message kinds (a header's first number; :mod:`dmlctl.ps.channel` says what
    each one carries)."""

    PUSH = 1
    PULL = 2
    DONE = 3
    PULL_REPLY = 4
    CLOSE = 5
    SNAPSHOT = 6
    SNAPSHOT_REPLY = 7
    RESTORE = 8
    HELLO = 9
    LEFT = 10  # never sent: what a server's endpoint reads when a connection ends early


Header = tuple[int, int, int, int, int, int, float]
Frame = tuple[Header, torch.Tensor, int]
"""What a server's endpoint hands on: the header, the payload bytes, the worker."""
_Item = tuple[Header, torch.Tensor, int, "Connection"] | BaseException
"""What a reader puts in the inbox: a frame and the connection it came on."""


class ConnectionLost(ConnectionError):
    """The other end closed the connection or died (the text says which rank)."""


class Connection:
    """One TCP connection that carries frames; sends are serialized by a lock (a
    worker's communication thread and its trainer may both send)."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # not a Unix socket pair
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock)
        self.sock = sock
        self.peer = peer  # in error messages: 'worker rank 3', 'parameter server rank 4'
        self._send_lock = threading.Lock()
        self.superseded: Callable[[], bool] | None = None
        """Asked while a read waits: whether a newer process replaced the peer (a
        parameter server replaced in place whose old host froze or was cut off keeps
        its connections open); then the read fails as if the connection broke."""

    def send(self, fields: Fields, payload: torch.Tensor | None = None) -> None:
        """Send one frame: the header (``size`` is the payload's byte count) and the
        payload's bytes (any dtype, made contiguous)."""
        raw = _bytes_of(payload) if payload is not None else None
        size = raw.nbytes if raw is not None else 0
        op, rank, clock, shard_id, extra, lr = fields
        header = HEADER.pack(op, rank, clock, shard_id, extra, size, lr)
        with self._send_lock:
            try:
                self._send_all(header)
                if raw is not None and size:
                    self._send_all(raw)
            except (OSError, ValueError) as exc:  # ValueError: closed by another thread
                raise ConnectionLost(f"{self.peer}: Connection closed by peer ({exc})") from exc

    def _send_all(self, data: bytes | memoryview) -> None:
        """``sendall``; with :attr:`superseded` set, in the pieces the socket takes,
        asking it every :data:`SUPERSEDED_POLL_S` seconds while the socket takes
        nothing (a frozen peer reads nothing, and its kernel keeps the connection)."""
        if self.superseded is None:
            self.sock.sendall(data)
            return
        view = memoryview(data)
        sent = 0
        while sent < view.nbytes:
            try:
                sent += self.sock.send(view[sent:], socket.MSG_DONTWAIT)
            except BlockingIOError:
                writable = select.select([], [self.sock], [], SUPERSEDED_POLL_S)[1]
                if not writable and self.superseded():
                    raise OSError("a newer process replaced it") from None

    def read_header(self) -> Header | None:
        """The next frame's header, or None when the peer closed the connection
        between two frames. Raises :class:`ConnectionLost` on a connection that broke
        within a frame, or a header whose size is absurd."""
        raw = self._read(HEADER.size, eof_ok=True)
        if raw is None:
            return None
        fields: Header = HEADER.unpack(raw)
        if not 0 <= fields[5] <= MAX_PAYLOAD:
            raise ConnectionLost(f"{self.peer}: corrupt frame header {fields}")
        return fields

    def read_into(self, out: torch.Tensor) -> None:
        """Fill ``out`` (contiguous, CPU, any dtype) with the next payload bytes."""
        self._fill(_bytes_of(out), eof_ok=False)

    def payload(self, size: int) -> torch.Tensor:
        """The next ``size`` payload bytes, as uint8."""
        out = torch.empty(size, dtype=torch.uint8)
        if size:
            self.read_into(out)
        return out

    def close(self) -> None:
        """Close the connection (the peer reads an end of stream)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _read(self, n: int, *, eof_ok: bool) -> bytes | None:
        buf = bytearray(n)
        return bytes(buf) if self._fill(memoryview(buf), eof_ok=eof_ok) else None

    def _fill(self, view: memoryview, *, eof_ok: bool) -> bool:
        """Fill ``view`` from the socket; False when the peer closed the connection
        before the first byte and ``eof_ok``. Raises :class:`ConnectionLost` when the
        connection breaks or ends early, or when :attr:`superseded` says, as the
        reader waits, that a newer process replaced the peer."""
        got = 0
        while got < view.nbytes:
            try:
                self._await_data()
                n = self.sock.recv_into(view[got:])
            except (OSError, ValueError) as exc:  # ValueError: closed by another thread
                raise ConnectionLost(f"{self.peer}: Connection reset by peer ({exc})") from exc
            if n == 0:
                if got == 0 and eof_ok:
                    return False
                raise ConnectionLost(f"{self.peer}: Connection closed by peer")
            got += n
        return True

    def _await_data(self) -> None:
        """Return once the socket has data (or its end) to read; asks
        :attr:`superseded` every :data:`SUPERSEDED_POLL_S` seconds meanwhile."""
        if self.superseded is None:
            return
        while not select.select([self.sock], [], [], SUPERSEDED_POLL_S)[0]:
            if self.superseded():
                raise OSError("a newer process replaced it")


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The bytes of a CPU tensor, without a copy when it is contiguous."""
    flat = tensor.detach().reshape(-1).contiguous()
    return flat.view(torch.uint8).numpy().data


# ----------------------------------------------------------------- the server's end


class Endpoint:
    """A server process's listener and its workers' connections (module docstring):
    :meth:`get` takes the frames of all workers in the order they arrived."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.inbox: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self.conns: dict[int, Connection] = {}
        host = advertised_host()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((host, 0))
        self._listener.listen(128)
        port = self._listener.getsockname()[1]
        store = rejoin.store()
        generation = store.add(f"{address_key(rank)}/generation", 1)  # 2 for a replacement
        store.set(address_key(rank), f"{host}:{port} {generation}")
        self.generation = generation
        threading.Thread(target=self._accept, name="dmlctl-ps-accept", daemon=True).start()

    def superseded(self) -> bool:
        """Whether a newer process of this server's rank published its address (this
        one's host froze or was cut off, and it was replaced in place meanwhile)."""
        return _server_address(self.rank)[1] > self.generation

    def get(self, timeout: float | None = None) -> Frame | None:
        """The next frame from any worker (None after ``timeout`` seconds without one):
        a worker's HELLO as it connects (its connection then replaces, and closes, one
        an earlier process of that rank made), its frames, and a LEFT frame when its
        connection ends before its CLOSE; frames and a LEFT of a connection already
        replaced are dropped. Raises what a reader met otherwise (a corrupt frame)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                left = None if end is None else max(0.0, end - time.monotonic())
                item = self.inbox.get(timeout=left)
            except queue.Empty:
                return None
            if isinstance(item, BaseException):
                raise item
            header, payload, worker, conn = item
            if header[0] == Op.HELLO:
                old = self.conns.get(worker)
                self.conns[worker] = conn
                if old is not None:
                    old.close()
            elif self.conns.get(worker) is not conn:
                continue  # an earlier process's, read after its replacement's HELLO
            return header, payload, worker

    def send(self, worker: int, fields: Fields, payload: torch.Tensor | None = None) -> None:
        """Send a frame to ``worker`` (on the connection of the last HELLO :meth:`get`
        returned); raises :class:`ConnectionLost` when that connection has ended."""
        self.conns[worker].send(fields, payload)

    def close(self) -> None:
        """Stop listening and end every connection."""
        with contextlib.suppress(OSError):
            self._listener.close()
        for conn in list(self.conns.values()):
            conn.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return  # closed
            conn = Connection(sock, f"a worker at {peer[0]}")
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: Connection) -> None:
        """One connection's life: its HELLO (into the inbox), then every frame until
        CLOSE; an end before CLOSE, or a broken frame (the worker is gone all the
        same), becomes a LEFT frame. A connection whose first frame is no HELLO (not a
        worker of this run) is closed, and said on stderr."""
        try:
            first = conn.read_header()
        except ConnectionLost:
            first = None
        if first is None or first[0] != Op.HELLO:
            print(
                f"dmlctl: parameter server rank {self.rank}: {conn.peer} connected without "
                f"a HELLO ({first}); closed",
                file=sys.stderr,
                flush=True,
            )
            conn.close()
            return
        worker = first[1]
        conn.peer = f"worker rank {worker}"
        self.inbox.put((first, _EMPTY, worker, conn))
        with contextlib.suppress(ConnectionLost):
            while (header := conn.read_header()) is not None:
                self.inbox.put((header, conn.payload(header[5]), worker, conn))
                if header[0] == Op.CLOSE:
                    return
        self.inbox.put(((int(Op.LEFT), worker, 0, -1, 0, 0, NO_LR), _EMPTY, worker, conn))


_EMPTY = torch.empty(0, dtype=torch.uint8)
_endpoint: tuple[object, Endpoint] | None = None


def endpoint(rank: int) -> Endpoint:
    """This server process's endpoint in the current process group (made at the
    first call of the group, which publishes its address)."""
    global _endpoint
    group = dist.group.WORLD
    if _endpoint is None or _endpoint[0] is not group or _endpoint[1].rank != rank:
        if _endpoint is not None:
            _endpoint[1].close()
        _endpoint = (group, Endpoint(rank))
    return _endpoint[1]


# ----------------------------------------------------------------- the worker's end

_connections: tuple[object, dict[int, Connection]] | None = None
RECONNECT_TIMEOUT_S = 300.0
"""How long a worker waits for a lost server's replacement."""
_generations: dict[int, int] = {}  # server rank → generation of the server connected to


def connection(worker_rank: int, server_rank: int, sent: int = 0) -> Connection:
    """This worker process's connection to ``server_rank`` in the current process
    group: made at the first call (waiting in the store for the server's address),
    its first frame a HELLO carrying ``sent``, the pushes this worker process sent
    that server so far."""
    conns = _worker_connections()
    if server_rank not in conns:
        conns[server_rank] = _connect(worker_rank, server_rank, _server_address(server_rank), sent)
    return conns[server_rank]


def reconnect(
    worker_rank: int, server_rank: int, sent: int, timeout: float = RECONNECT_TIMEOUT_S
) -> Connection:
    """A connection to the replacement of ``server_rank`` (``restart.mode: in_place``),
    whose old connection broke: waits until a newer server than the one connected to
    published its address (at most ``timeout`` seconds; then :class:`ConnectionLost`),
    then connects as :func:`connection` does."""
    conns = _worker_connections()
    old = conns.pop(server_rank, None)
    if old is not None:
        old.close()
    seen = _generations.get(server_rank, 0)
    end = time.monotonic() + timeout
    while (found := _server_address(server_rank))[1] <= seen:
        if time.monotonic() > end:
            raise ConnectionLost(
                f"parameter server rank {server_rank}: no replacement within {timeout:.0f} s"
            )
        time.sleep(0.05)
    conns[server_rank] = _connect(worker_rank, server_rank, found, sent)
    return conns[server_rank]


def _worker_connections() -> dict[int, Connection]:
    """This worker process's connections of the current process group (a new group
    ends those of the old one)."""
    global _connections
    group = dist.group.WORLD
    if _connections is None or _connections[0] is not group:
        for old in _connections[1].values() if _connections is not None else ():
            old.close()
        _connections = (group, {})
    return _connections[1]


def _server_address(server_rank: int) -> tuple[str, int]:
    """The address ``server_rank``'s latest process published, and its generation
    (waits until one did)."""
    value = rejoin.store().get(address_key(server_rank)).decode()
    address, _, generation = value.partition(" ")
    return address, int(generation or 1)


def _connect(worker_rank: int, server_rank: int, found: tuple[str, int], sent: int) -> Connection:
    """Connect to the server at ``found`` (address, generation) and say HELLO."""
    address, generation = found
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    conn = Connection(sock, f"parameter server rank {server_rank} ({address})")
    if rejoin.servers_replaced():  # a frozen or cut-off server's socket stays open
        conn.superseded = lambda: _server_address(server_rank)[1] > generation
    conn.send((int(Op.HELLO), worker_rank, 0, -1, sent, NO_LR))
    _generations[server_rank] = generation
    return conn


def disconnect(server_rank: int) -> None:
    """End this worker's connection to ``server_rank`` (after its CLOSE)."""
    if _connections is not None and server_rank in _connections[1]:
        _connections[1].pop(server_rank).close()


def address_key(server_rank: int) -> str:
    """The store key of ``server_rank``'s published address (this attempt's)."""
    return rejoin.key(f"ps/{server_rank}")


def closed_key(worker_rank: int) -> str:
    """The store key a worker sets once it closed (a server replaced in place reads
    it: the workers that will say nothing more)."""
    return rejoin.key(f"ps-closed/{worker_rank}")
