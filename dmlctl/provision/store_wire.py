"""The wire of torch's ``TCPStore`` (torch ≥ 2.4), as :mod:`dmlctl.provision.store_server`
reads and writes it: the magic number a client validates with, the query codes in
the order of torch's enum, the replies, the limits on keys and values, and exact
reads of one client's socket. Pure Python: the control plane never imports torch."""

from __future__ import annotations

import socket
import struct

MAGIC = 0x3C85F7CE
MAX_KEY = 8 * 1024
MAX_VALUE = 8 * 1024 * 1024
MAX_KEYS = 128 * 1024
U64 = struct.Struct("<Q")
I64 = struct.Struct("<q")
U32 = struct.Struct("<I")

# Query types, in the order of torch's enum.
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY = range(9)
APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN = range(9, 17)
READY, NOT_READY = b"\x00", b"\x01"
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"


class ProtocolError(Exception):
    """A client sent what the protocol does not allow; its connection is closed."""


class Reader:
    """Exact reads from one client socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def exact(self, n: int) -> bytes:
        """``n`` bytes; EOFError when the client closed first."""
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            r = self._sock.recv_into(view[got:], n - got)
            if r == 0:
                raise EOFError
            got += r
        return bytes(buf)

    def u64(self) -> int:
        return int(U64.unpack(self.exact(8))[0])

    def i64(self) -> int:
        return int(I64.unpack(self.exact(8))[0])

    def key(self) -> str:
        n = self.u64()
        if n > MAX_KEY:
            raise ProtocolError(f"a key of {n} bytes (at most {MAX_KEY})")
        return self.exact(n).decode("utf-8", errors="surrogateescape")

    def value(self) -> bytes:
        n = self.u64()
        if n > MAX_VALUE:
            raise ProtocolError(f"a value of {n} bytes (at most {MAX_VALUE})")
        return self.exact(n)

    def keys(self) -> list[str]:
        n = self.u64()
        if n > MAX_KEYS:
            raise ProtocolError(f"{n} keys in one query (at most {MAX_KEYS})")
        return [self.key() for _ in range(n)]


def vector(value: bytes) -> bytes:
    """``value`` as the wire sends it: its length (8 bytes), then its bytes."""
    return U64.pack(len(value)) + value
