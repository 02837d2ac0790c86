"""The run's store held by the controller: a key-value server that speaks the wire
protocol of torch's ``TCPStore``, in pure Python (the control plane never imports
torch).

In a run that replaces lost hosts in place, every torchrun meets at this store
(``--rdzv-endpoint``, with dmlctl's rendezvous backend, :mod:`dmlctl.agent.rendezvous`)
and every rank uses it as its ``MASTER_ADDR:MASTER_PORT`` store. So no training host
serves it, and the host of rank 0 can be lost and replaced like any other while the
ranks that live go on; the store lives as long as the controller's attempt.

Why not torch's own server in a helper process: the controller never imports torch,
and such a helper would import it (a second or more of a core) before every in-place
attempt could start; and this one closes the connections of a host that stopped
answering (below), so a lost host leaves nothing behind. Because torch's protocol has
no version, only a magic number and a growing list of queries, it is tested against
the client of each torch the project declares: ``make test-compat TORCH=X`` runs
every call of that torch's ``TCPStore`` client against it
(``tests/unit/test_store_server.py``) and the in-place tests, whose ranks and
torchruns are its clients.

What it promises, as torch's own server does (``TCPStoreLibUvBackend.cpp``; the
protocol of torch ≥ 2.4: a client first sends ``VALIDATE`` with the magic number, then
its queries):

* ``set``/``multi_set``, ``get``/``multi_get`` (an absent key reads as empty; clients
  wait for it first), ``add`` (a decimal integer, created at 0), ``compare_set`` (an
  absent key is set only when the expected value is empty), ``append``,
  ``delete_key``, ``num_keys``, ``check``, the queue calls, and ``ping``;
* ``wait``: answered once every key is there; a client that gives up sends
  ``CANCEL_WAIT`` and is answered ``WAIT_CANCELED`` (after any ``STOP_WAITING`` already
  sent);
* a key over 8 KiB, a value over 8 MiB (torch's limits: :mod:`~dmlctl.provision.store_wire`
  has them and the rest of the wire) or an unknown query closes that client's
  connection, and only it;
* every connection is served by a thread of its own; the data is guarded by one lock,
  and each connection's replies go out whole, in the order they were made; a client
  whose host stops answering is closed within :data:`SILENT_CLIENT_S` seconds.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from dmlctl.provision import store_admission
from dmlctl.provision.store_wire import (
    ADD,
    APPEND,
    CANCEL_WAIT,
    CHECK,
    COMPARE_SET,
    DELETE_KEY,
    GET,
    GETNUMKEYS,
    I64,
    MAGIC,
    MAX_KEYS,
    MULTI_GET,
    MULTI_SET,
    NOT_READY,
    PING,
    QUEUE_LEN,
    QUEUE_POP,
    QUEUE_PUSH,
    READY,
    SET,
    STOP_WAITING,
    U32,
    VALIDATE,
    WAIT,
    WAIT_CANCELED,
    ProtocolError,
    Reader,
    vector,
)


def _more_files() -> None:
    """Raise this process's soft limit of open files to its hard limit: every client
    of the store is a socket (and a thread)."""
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass(eq=False)
class _Client:
    """One connection: its socket, its send lock and the keys it still waits for."""

    sock: socket.socket
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    awaited: int = 0

    def send(self, data: bytes) -> None:
        with self.send_lock, contextlib.suppress(OSError):
            self.sock.sendall(data)


class _Data:
    """The keys, values, queues and waiters (callers hold :attr:`lock`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, bytes] = {}
        self.queues: dict[str, collections.deque[bytes]] = {}
        self.waiting: dict[str, list[_Client]] = {}

    def present(self, keys: Iterable[str]) -> bool:
        return all(k in self.values or self.queues.get(k) for k in keys)

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value
        self.wake(key)

    def wake(self, key: str, one: bool = False) -> None:
        """Answer the clients waiting for ``key`` whose last awaited key it was
        (with ``one``: the first such client only)."""
        for client in self.waiting.get(key, []):
            client.awaited -= 1
            if client.awaited == 0:
                client.send(STOP_WAITING)
                if one:
                    self.waiting[key].remove(client)
                    return
        self.waiting.pop(key, None)

    def forget(self, client: _Client) -> None:
        """``client`` waits for nothing any more."""
        client.awaited = 0
        for key in [k for k, cs in self.waiting.items() if client in cs]:
            self.waiting[key] = [c for c in self.waiting[key] if c is not client]
            if not self.waiting[key]:
                del self.waiting[key]


_Handler = Callable[["StoreServer", _Client, Reader], None]
SILENT_CLIENT_S = 30.0
"""A client whose host stopped answering (cut off, powered off) is closed within this
long at the least (TCP keepalive and user timeout), so its thread ends with it; a run
whose ``restart.host_timeout`` is longer waits that long and more (:class:`StoreServer`)."""


ACCEPT_RETRY_S = 0.1


def _keep_alive(sock: socket.socket, silent_after: float) -> None:
    """Close ``sock`` once its peer's host has not answered for ``silent_after`` s."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, int(silent_after / 3))
    probes = (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", max(1, idle // 2)), ("TCP_KEEPCNT", 4))
    for name, value in probes:
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(silent_after * 1000))


class StoreServer:
    """A store server listening on ``host:port`` (port 0: a free one, see
    :attr:`port`) until :meth:`close`; a client silent ``silent_after`` seconds (at
    least :data:`SILENT_CLIENT_S`) is closed. Raises OSError when it cannot listen.

    ``peers``: the only addresses a client may connect from (the cluster's hosts; None:
    any); a client from elsewhere, or one over ``max_clients`` connections, is closed
    at once and ``refused`` is told why (the run goes on:
    :mod:`~dmlctl.provision.store_admission`)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        silent_after: float = 0.0,
        peers: Collection[str] | None = None,
        max_clients: int = store_admission.MAX_CLIENTS,
        refused: Callable[[str], None] = lambda why: None,
    ) -> None:
        _more_files()
        self._silent_after = max(SILENT_CLIENT_S, silent_after)
        self._admission = store_admission.Admission.of(peers, max_clients)
        self._refused = refused
        self._listener = socket.create_server((host, port), backlog=1024)
        self.host = host
        self.port = int(self._listener.getsockname()[1])
        self._data = _Data()
        self._clients: set[_Client] = set()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="dmlctl-store", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """``host:port``, as torchrun's ``--rdzv-endpoint`` takes it."""
        return f"{self.host}:{self.port}"

    def snapshot(self) -> dict[str, bytes]:
        """A copy of every key and its value (for tests and diagnostics)."""
        with self._data.lock:
            return dict(self._data.values)

    def close(self) -> None:
        """Stop listening and close every connection; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._data.lock:
            clients = list(self._clients)
        for c in clients:
            with contextlib.suppress(OSError):
                c.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5.0)

    def __enter__(self) -> StoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        """Accept clients until :meth:`close`; a failed accept (a connection reset
        before it was taken, no file descriptor left) is retried after a moment."""
        while not self._closed.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                self._closed.wait(ACCEPT_RETRY_S)
                continue
            why = self._admission.refusal(peer[0], len(self._clients))
            if why is not None:
                sock.close()
                self._refused(why)
                continue
            try:
                self._take(sock)
            except (OSError, RuntimeError):  # reset at once, or no thread left: drop it
                sock.close()

    def _take(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _keep_alive(sock, self._silent_after)
        client = _Client(sock)
        with self._data.lock:
            if self._closed.is_set():
                raise OSError("the store is closed")
            self._clients.add(client)
        name = "dmlctl-store-client"
        threading.Thread(target=self._serve, args=(client,), name=name, daemon=True).start()

    def _serve(self, client: _Client) -> None:
        reader = Reader(client.sock)
        try:
            if reader.exact(1)[0] != VALIDATE or U32.unpack(reader.exact(4))[0] != MAGIC:
                return
            while not self._closed.is_set():
                query = reader.exact(1)[0]
                handler = _HANDLERS.get(query)
                if handler is None:
                    return
                handler(self, client, reader)
        except (EOFError, OSError, ProtocolError, struct.error, ValueError):
            return  # gone, or a query torch's server refuses too: that client only
        finally:
            with self._data.lock:
                self._data.forget(client)
                self._clients.discard(client)
            client.sock.close()

    # ------------------------------------------------------------------ queries

    def _set(self, client: _Client, r: Reader) -> None:
        key, value = r.key(), r.value()
        with self._data.lock:
            self._data.set(key, value)

    def _multi_set(self, client: _Client, r: Reader) -> None:
        n = r.u64()
        if n > MAX_KEYS:
            raise ProtocolError(f"{n} keys in one query (at most {MAX_KEYS})")
        pairs = [(r.key(), r.value()) for _ in range(n)]
        with self._data.lock:
            for key, value in pairs:
                self._data.set(key, value)

    def _compare_set(self, client: _Client, r: Reader) -> None:
        key, expected, new = r.key(), r.value(), r.value()
        with self._data.lock:
            current = self._data.values.get(key)
            if (current is None and not expected) or current == expected:
                self._data.values[key] = new
            answer = self._data.values.get(key, expected)
            self._data.wake(key)
        client.send(vector(answer))

    def _get(self, client: _Client, r: Reader) -> None:
        key = r.key()
        with self._data.lock:
            value = self._data.values.get(key, b"")
        client.send(vector(value))

    def _multi_get(self, client: _Client, r: Reader) -> None:
        keys = r.keys()
        with self._data.lock:
            values = [self._data.values.get(k, b"") for k in keys]
        client.send(b"".join(vector(v) for v in values))

    def _add(self, client: _Client, r: Reader) -> None:
        key, amount = r.key(), r.i64()
        with self._data.lock:
            old = self._data.values.get(key)
            try:
                total = amount + (int(old.decode()) if old is not None else 0)
            except ValueError as e:
                raise ProtocolError(f"add to {key!r}, which holds no integer") from e
            self._data.set(key, str(total).encode())
        client.send(I64.pack(total))

    def _append(self, client: _Client, r: Reader) -> None:
        key, value = r.key(), r.value()
        with self._data.lock:
            self._data.set(key, self._data.values.get(key, b"") + value)

    def _check(self, client: _Client, r: Reader) -> None:
        keys = r.keys()
        with self._data.lock:
            ready = self._data.present(keys)
        client.send(READY if ready else NOT_READY)

    def _wait(self, client: _Client, r: Reader) -> None:
        keys = r.keys()
        with self._data.lock:
            if self._data.present(keys):
                client.send(STOP_WAITING)
                return
            missing = [k for k in keys if k not in self._data.values]
            client.awaited = len(missing)
            for k in missing:
                self._data.waiting.setdefault(k, []).append(client)

    def _cancel_wait(self, client: _Client, r: Reader) -> None:
        with self._data.lock:
            self._data.forget(client)
        client.send(WAIT_CANCELED)

    def _num_keys(self, client: _Client, r: Reader) -> None:
        with self._data.lock:
            n = len(self._data.values)
        client.send(I64.pack(n))

    def _delete(self, client: _Client, r: Reader) -> None:
        key = r.key()
        with self._data.lock:
            n = 1 if self._data.values.pop(key, None) is not None else 0
        client.send(I64.pack(n))

    def _ping(self, client: _Client, r: Reader) -> None:
        client.send(r.exact(4))

    def _queue_push(self, client: _Client, r: Reader) -> None:
        key, value = r.key(), r.value()
        with self._data.lock:
            self._data.queues.setdefault(key, collections.deque()).append(value)
            self._data.wake(key, one=True)

    def _queue_pop(self, client: _Client, r: Reader) -> None:
        key = r.key()
        with self._data.lock:
            queue = self._data.queues.setdefault(key, collections.deque())
            answer = I64.pack(len(queue)) + (vector(queue.popleft()) if queue else b"")
        client.send(answer)

    def _queue_len(self, client: _Client, r: Reader) -> None:
        key = r.key()
        with self._data.lock:
            n = len(self._data.queues.get(key, ()))
        client.send(I64.pack(n))


_HANDLERS: dict[int, _Handler] = {
    SET: StoreServer._set,
    COMPARE_SET: StoreServer._compare_set,
    GET: StoreServer._get,
    ADD: StoreServer._add,
    CHECK: StoreServer._check,
    WAIT: StoreServer._wait,
    GETNUMKEYS: StoreServer._num_keys,
    DELETE_KEY: StoreServer._delete,
    APPEND: StoreServer._append,
    MULTI_GET: StoreServer._multi_get,
    MULTI_SET: StoreServer._multi_set,
    CANCEL_WAIT: StoreServer._cancel_wait,
    PING: StoreServer._ping,
    QUEUE_PUSH: StoreServer._queue_push,
    QUEUE_POP: StoreServer._queue_pop,
    QUEUE_LEN: StoreServer._queue_len,
}
