"""The parameter-server channel's own TCP connections: frames, and how the two ends
find each other.

Every message between a worker and a server is one **frame** (its header and the
connection that carries it: :mod:`dmlctl.ps.connection`). A worker holds one
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
import queue
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

from dmlctl.ps import handshake
from dmlctl.ps.addresses import advertised_host
from dmlctl.ps.connection import (
    NO_LR,
    Connection,
    ConnectionLost,
    Fields,
    Header,
    Op,
)
from dmlctl.runtime import rejoin
from dmlctl.runtime.signed_store import ForgedValue

Frame = tuple[Header, torch.Tensor, int]
"""What a server's endpoint hands on: the header, the payload bytes, the worker."""
_Item = tuple[Header, torch.Tensor, int, "Connection"] | BaseException
"""What a reader puts in the inbox: a frame and the connection it came on."""


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
        address = f"{host}:{port} {generation}"  # signed by the store (rejoin.store)
        store.set(f"{address_key(rank)}/g{generation}", address)  # kept: the newest wins
        store.set(address_key(rank), address)
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
            self._refuse(conn, f"connected without a HELLO ({first})")
            return
        try:
            proved = handshake.server_hello(conn, self.rank, conn.payload(first[5]))
        except ConnectionLost:
            proved = False
        if not proved:
            self._refuse(conn, "could not prove it holds the run's key")
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

    def _refuse(self, conn: Connection, why: str) -> None:
        """Close a connection that is no worker of this run, and say so on stderr."""
        print(
            f"dmlctl: parameter server rank {self.rank}: {conn.peer} {why}; closed",
            file=sys.stderr,
            flush=True,
        )
        conn.close()


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
    group: made at the first call (waiting in the store for the server's address; for
    a server that can be replaced, refused there, for its replacement's), its first
    frame a HELLO carrying ``sent``, the pushes this worker process sent that server
    so far."""
    conns = _worker_connections()
    if server_rank not in conns:
        found = _server_address(server_rank)
        try:
            conns[server_rank] = _connect(worker_rank, server_rank, found, sent)
        except (ConnectionRefusedError, handshake.Impostor):
            if not rejoin.servers_replaced():
                raise
            # That server died before this worker first reached it: wait for its
            # replacement as a worker whose connection broke does.
            _generations[server_rank] = found[1]
            return reconnect(worker_rank, server_rank, sent)
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
    (waits until one did). A value no rank of the run signed (written into the store
    by another process: :mod:`dmlctl.runtime.signed_store`) is never used: the newest
    generation the servers signed is, said once on stderr."""
    store, key = rejoin.store(), address_key(server_rank)
    while True:
        try:
            return _address(store.get(key))
        except ForgedValue:
            if key not in _forged:
                _forged.add(key)
                said = f"refused a forged parameter-server address under {key!r}"
                print(f"dmlctl: {said} (not written by a rank of this run)", file=sys.stderr)
        for generation in range(store.add(f"{key}/generation", 0), 0, -1):
            kept = f"{key}/g{generation}"
            if store.check([kept]):  # a forged one is removed, and not used
                return _address(store.get(kept))
        time.sleep(0.05)


_forged: set[str] = set()  # the address keys found forged (said once each)


def _address(value: bytes) -> tuple[str, int]:
    """``(address, generation)`` from what a server published."""
    address, _, generation = value.decode().partition(" ")
    return address, int(generation or 1)


def _connect(worker_rank: int, server_rank: int, found: tuple[str, int], sent: int) -> Connection:
    """Connect to the server at ``found`` (address, generation) and say HELLO."""
    address, generation = found
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    conn = Connection(sock, f"parameter server rank {server_rank} ({address})")
    if rejoin.servers_replaced():  # a frozen or cut-off server's socket stays open
        conn.superseded = lambda: _server_address(server_rank)[1] > generation
    handshake.worker_hello(conn, (int(Op.HELLO), worker_rank, 0, -1, sent, NO_LR))
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
