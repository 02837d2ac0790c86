"""Host key policy for SSH connections: known_hosts is the authority.

* a host whose key is in known_hosts and matches: accepted;
* a host whose key is **not** known: refused with its fingerprint, unless the user
  passed ``--accept-new-host-keys``, in which case the key is appended to the user's
  known_hosts file and reported through ``on_new_key`` (so the CLI can show it);
* a host whose key **changed**: always refused (paramiko raises
  ``BadHostKeyException`` before any policy is asked).

This module is the only place that decides about host keys; it imports paramiko
(through the SSH transport only).
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import paramiko

NewKeyCallback = Callable[[str, str, str], None]
"""(known_hosts name, key type, SHA256 fingerprint) of a key that was just trusted."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:…`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The name a known_hosts line uses for ``host:port``."""
    return host if port == 22 else f"[{host}]:{port}"


class UnknownHostKey(paramiko.SSHException):  # type: ignore[misc]
    """The server's key is not in known_hosts and new keys are not accepted."""

    def __init__(self, name: str, key_type: str, fp: str) -> None:
        self.name, self.key_type, self.fingerprint = name, key_type, fp
        super().__init__(
            f"host key for {name} is not known ({key_type} {fp}); check the fingerprint"
            " and rerun with --accept-new-host-keys to trust it"
        )


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    """Refuses unknown keys, or — with ``accept_new`` — records them in ``save_to``."""

    _lock = threading.Lock()

    def __init__(
        self, *, accept_new: bool, save_to: Path, on_new_key: NewKeyCallback | None = None
    ) -> None:
        self.accept_new = accept_new
        self.save_to = save_to
        self.on_new_key = on_new_key

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        fp = fingerprint(key)
        if not self.accept_new:
            raise UnknownHostKey(hostname, key.get_name(), fp)
        with self._lock:
            self.save_to.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.save_to, "a", encoding="ascii") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            os.chmod(self.save_to, 0o600)
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.on_new_key is not None:
            self.on_new_key(hostname, key.get_name(), fp)


def describe_bad_key(exc: paramiko.BadHostKeyException) -> str:
    """The message for a changed host key."""
    return (
        f"host key for {exc.hostname} CHANGED: known_hosts has {fingerprint(exc.expected_key)},"
        f" the server offers {exc.key.get_name()} {fingerprint(exc.key)}; refusing to connect"
        " (someone may be intercepting the connection; if the host was reinstalled, remove"
        " its old line from known_hosts)"
    )


def load_known_hosts(client: paramiko.SSHClient, files: Sequence[Path]) -> None:
    """Load every existing known_hosts file into ``client`` (hashed entries included)."""
    for path in files:
        if path.is_file():
            client.get_host_keys().load(str(path))
