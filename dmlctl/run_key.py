"""The run's own secret: what dmlctl's channels authenticate with (torch-free).

The controller makes a random key for each run (kept in its ``secrets.json``, 0600;
``plan.json`` shows ``***``). It reaches each host in the agent's configuration, over
SSH's standard input, never in an argument, a log or a record; the agent writes it to
its rank directory (0600) and gives the ranks the file's path in
:data:`~dmlctl.protocol.ENV_RUN_KEY_FILE`, never the key itself.

With it the ranks sign every value they write into the run's store and check every
value they read (:func:`sign`, :func:`verify`, through
:class:`dmlctl.runtime.signed_store.SignedStore`), and a
worker and a parameter server prove to each other that both hold it (:func:`proof`)
before any frame passes: a process that can write to the store or listen on a port,
but was not given the key, is refused. Without a key (a rank run by hand) nothing is
signed and nothing is checked.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from functools import lru_cache

from dmlctl.protocol import ENV_RUN_KEY_FILE

KEY_FILE = "run.key"
"""The key's file in a host's rank directory."""
MAC_BYTES = 32  # HMAC-SHA256
NONCE_BYTES = 16


def new_key() -> str:
    """A fresh run key (hex)."""
    return secrets.token_hex(32)


def write_key(rank_dir: str, key: str) -> str:
    """Write ``key`` into ``rank_dir`` (0600, replaced whole); the file's path."""
    path = os.path.join(rank_dir, KEY_FILE)
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key)
    os.replace(tmp, path)
    return path


@lru_cache(maxsize=1)
def _key_from(path: str) -> bytes | None:
    try:
        with open(path, encoding="ascii") as f:
            return bytes.fromhex(f.read().strip())
    except (OSError, ValueError):
        return None


def key(env: Mapping[str, str] = os.environ) -> bytes | None:
    """The run key of a process with environment ``env`` (this one's by default), from
    :data:`~dmlctl.protocol.ENV_RUN_KEY_FILE`; None without one."""
    path = env.get(ENV_RUN_KEY_FILE)
    return _key_from(path) if path else None


def proof(run_key: bytes, label: bytes, *parts: bytes) -> bytes:
    """What proves holding ``run_key`` for ``label`` and ``parts`` (HMAC-SHA256)."""
    mac = hmac.new(run_key, label, hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(4, "big") + part)
    return mac.digest()


def sign(value: bytes, run_key: bytes | None = None, name: str = "") -> bytes:
    """``value`` with its proof in front (hex, then a space), when there is a key; bound
    to ``name`` (the store key it is written under): under any other it is a forgery."""
    run_key = run_key if run_key is not None else key()
    if run_key is None:
        return value
    return _store_proof(run_key, name, value).hex().encode() + b" " + value


def verify(signed: bytes, run_key: bytes | None = None, name: str = "") -> bytes | None:
    """The value :func:`sign` signed for ``name``; None when its proof is missing or
    wrong (written by a process without the run's key, or for another name). Without
    a key, ``signed`` as it is."""
    run_key = run_key if run_key is not None else key()
    if run_key is None:
        return signed
    mac, sep, value = signed.partition(b" ")
    if not sep or len(mac) != 2 * MAC_BYTES:
        return None
    try:
        good = hmac.compare_digest(
            bytes.fromhex(mac.decode("ascii")), _store_proof(run_key, name, value)
        )
    except (ValueError, UnicodeDecodeError):
        return None
    return value if good else None


def _store_proof(run_key: bytes, name: str, value: bytes) -> bytes:
    return proof(run_key, b"store", name.encode(), value)
