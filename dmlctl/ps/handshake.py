"""A worker and a parameter server prove to each other that both hold the run key
(:mod:`dmlctl.run_key`) before any frame of training passes between them.

1. The worker's ``HELLO`` carries a fresh nonce of its own.
2. The server answers with a ``HELLO`` that carries its own nonce and its proof over
   both nonces; the worker refuses a server whose proof is wrong (:class:`Impostor`:
   a process that took the address without the key).
3. The worker sends its proof in a second ``HELLO``; the server closes a worker
   whose proof is wrong, and names it in its log.

A proof covers both nonces and says which end made it, so no answer can be replayed
or reflected. Without a run key (a rank run by hand) a ``HELLO`` carries nothing and
nothing is checked.
"""

from __future__ import annotations

import hmac
import os

import torch

from dmlctl import run_key
from dmlctl.ps.connection import NO_LR, Connection, Fields, Op

SERVER = b"ps-server"
WORKER = b"ps-worker"


class Impostor(ConnectionError):
    """The other end of a connection does not hold the run key."""


def _tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _answer(conn: Connection) -> bytes:
    """The payload of the next frame if it is a HELLO, else nothing."""
    header = conn.read_header()
    if header is None or header[0] != Op.HELLO:
        return b""
    return conn.payload(header[5]).numpy().tobytes()


def worker_hello(conn: Connection, fields: Fields) -> None:
    """Say ``fields`` (a HELLO) to the server at the other end of ``conn``, proving
    the run key and checking the server's; :class:`Impostor` (the connection closed)
    when the server cannot prove it."""
    key = run_key.key()
    if key is None:
        conn.send(fields)
        return
    mine = os.urandom(run_key.NONCE_BYTES)
    conn.send(fields, _tensor(mine))
    answer = _answer(conn)
    theirs, said = answer[: run_key.NONCE_BYTES], answer[run_key.NONCE_BYTES :]
    if len(theirs) != run_key.NONCE_BYTES or not hmac.compare_digest(
        said, run_key.proof(key, SERVER, mine, theirs)
    ):
        conn.close()
        raise Impostor(f"{conn.peer} could not prove it holds the run's key: refused")
    conn.send(fields, _tensor(run_key.proof(key, WORKER, theirs, mine)))


def server_hello(conn: Connection, server_rank: int, hello: torch.Tensor) -> bool:
    """After a worker's HELLO (``hello``: its payload, the worker's nonce), prove the
    run key to it and check its proof: True when it holds the key (or the run has none)."""
    key = run_key.key()
    if key is None:
        return True
    theirs = hello.numpy().tobytes()
    if len(theirs) != run_key.NONCE_BYTES:
        return False
    mine = os.urandom(run_key.NONCE_BYTES)
    fields: Fields = (int(Op.HELLO), server_rank, 0, -1, 0, NO_LR)
    conn.send(fields, _tensor(mine + run_key.proof(key, SERVER, theirs, mine)))
    return hmac.compare_digest(_answer(conn), run_key.proof(key, WORKER, mine, theirs))
