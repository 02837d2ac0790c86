"""Values of any size in the run's store (runtime side, torch).

torch's store (libuv ``TCPStore``) refuses a value over 8 MiB and breaks the client
that sent it. :func:`put` writes a blob in pieces of at most :data:`PIECE` bytes under
a fresh generation, then the key itself — a small header naming that generation —
last, then removes the previous generation's pieces: a reader (:func:`get`) sees the
whole previous blob or the whole new one, never a mix. Every piece is signed
(:mod:`dmlctl.runtime.signed_store`). Each blob costs its size in the memory of the
store's host.
"""

from __future__ import annotations

import json

from dmlctl.runtime.signed_store import SignedStore

PIECE = 4 << 20
"""Bytes per piece: half the store's largest value."""


def put(store: SignedStore, key: str, data: bytes) -> None:
    """Store ``data`` under ``key`` (see the module docstring). Raises what the store
    raises (``RuntimeError`` and its subclasses)."""
    old = _header(store, key)
    generation = (old["generation"] + 1) if old else 1
    pieces = [data[i : i + PIECE] for i in range(0, len(data), PIECE)] or [b""]
    for i, piece in enumerate(pieces):
        store.set(_piece(key, generation, i), piece)
    header = {"generation": generation, "pieces": len(pieces), "size": len(data)}
    store.set(key, json.dumps(header))
    if old is not None:
        for i in range(old["pieces"]):
            store.delete_key(_piece(key, old["generation"], i))


def get(store: SignedStore, key: str) -> bytes | None:
    """The blob :func:`put` stored under ``key`` (None: none). Raises ``ValueError``
    when its pieces do not add up to its size (a writer died between them and the
    header is an older one's: cannot happen with one writer, which writes the
    header last)."""
    header = _header(store, key)
    if header is None:
        return None
    data = b"".join(
        store.get(_piece(key, header["generation"], i)) for i in range(header["pieces"])
    )
    if len(data) != header["size"]:
        raise ValueError(f"{key}: {len(data)} bytes in the store, its header says {header['size']}")
    return data


def _header(store: SignedStore, key: str) -> dict[str, int] | None:
    if not store.check([key]):
        return None
    value = json.loads(store.get(key))
    return {k: int(value[k]) for k in ("generation", "pieces", "size")}


def _piece(key: str, generation: int, index: int) -> str:
    return f"{key}/{generation}/{index}"
