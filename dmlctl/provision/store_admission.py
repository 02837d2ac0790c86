"""Which connections the run's store serves (:class:`~dmlctl.provision.store_server.StoreServer`):
only from the cluster's hosts, and no more than :data:`MAX_CLIENTS` at once. A refused
connection is closed before a byte of it is read; the run goes on."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

MAX_CLIENTS = 4096
"""Connections a store serves at once (a thread each); one more is closed at once."""


def plain(address: str) -> str:
    """An IP address as :func:`socket.accept` gives it (an IPv4 one mapped into IPv6
    unwrapped), to compare with the allowed peers."""
    return address.removeprefix("::ffff:")


@dataclass(frozen=True)
class Admission:
    """``peers``: the only addresses a client may connect from (None: any)."""

    peers: frozenset[str] | None = None
    max_clients: int = MAX_CLIENTS

    @classmethod
    def of(cls, peers: Collection[str] | None, max_clients: int = MAX_CLIENTS) -> Admission:
        return cls(None if peers is None else frozenset(map(plain, peers)), max_clients)

    def refusal(self, address: str, served: int) -> str | None:
        """Why a client from ``address`` is not served while ``served`` are (None: it is)."""
        address = plain(address)
        if self.peers is not None and address not in self.peers:
            return f"a connection from {address}, which is none of the run's hosts"
        if served >= self.max_clients:
            return f"a connection from {address} over the {self.max_clients} served at once"
        return None
