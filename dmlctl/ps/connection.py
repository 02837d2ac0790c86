"""One TCP connection of the parameter-server channel and its frames.

Every message between a worker and a server is one **frame**: a fixed header of seven
numbers ``(op, rank, clock, shard_id, extra, size, lr)`` (six little-endian int64 and
a float64, :data:`HEADER`) followed by ``size`` payload bytes. Who connects to whom,
and how the ends find each other: :mod:`dmlctl.ps.frames`.
"""

from __future__ import annotations

import contextlib
import enum
import select
import socket
import struct
import threading
from collections.abc import Callable

import torch

from dmlctl.ps.addresses import keep_alive

HEADER = struct.Struct("<qqqqqqd")
"""op, rank, clock, shard_id, extra, size (payload bytes), lr (NaN: none)."""
MAX_PAYLOAD = 1 << 40
"""A header announcing more payload bytes than this is corrupt."""
SUPERSEDED_POLL_S = 1.0
"""How often a waiting reader or writer asks whether its peer was replaced."""
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
