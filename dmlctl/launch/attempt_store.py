"""The store an attempt's torchruns meet at when the controller holds it (a run whose
hosts are replaced in place, ``plan.store_host``): opened as the attempt starts,
closed once it has ended. See :mod:`dmlctl.provision.store_server`."""

from __future__ import annotations

import socket
from collections.abc import Callable

from dmlctl.plan.model import LaunchPlan
from dmlctl.provision.store_server import StoreServer

SILENT_MARGIN_S = 10.0
"""Seconds beyond ``host_timeout`` before the store closes a silent host's clients."""


class AttemptStore:
    """At most one open store: the current attempt's."""

    def __init__(
        self, host_timeout: float | None, refused: Callable[[str], None] = lambda why: None
    ) -> None:
        self._silent_after = (host_timeout or 0.0) + SILENT_MARGIN_S
        self._server: StoreServer | None = None
        self._refused = refused  # told of each connection closed unserved (another thread)

    @property
    def endpoint(self) -> str | None:
        """``host:port`` of the open store; None when the attempt has none here."""
        return self._server.endpoint if self._server is not None else None

    def open(self, plan: LaunchPlan) -> str | None:
        """Close the last attempt's store and open this one's where ``plan`` says so.
        None when it is open, or the plan holds none here; else the one line to say:
        this machine cannot listen at the planned address (a run resumed elsewhere),
        so the store stays with rank 0's torchrun for this attempt."""
        self.close()
        if plan.store_host is None:
            return None
        try:
            self._server = StoreServer(
                plan.store_host,
                silent_after=self._silent_after,
                peers=run_peers(plan),
                refused=self._refused,
            )
        except OSError as e:
            return (
                f"the run's store stays with rank 0's host this attempt (this machine "
                f"cannot listen at {plan.store_host}: {e}): losing that host restarts the run"
            )
        return None

    def close(self) -> None:
        """Close the open store, if any."""
        if self._server is not None:
            self._server.close()
            self._server = None


LOOPBACKS = ("127.0.0.1", "::1")


def run_peers(plan: LaunchPlan) -> set[str] | None:
    """The addresses the run's hosts (and its spares) may connect to its store from:
    loopback, and every address each host's name resolves to here. None (any address)
    when a name does not resolve on this machine: the hosts' own resolution decides
    where they connect from, and a store that refused them would fail the run."""
    peers = set(LOOPBACKS)
    for host in (*plan.hosts, *plan.spares):
        if host.is_local:
            continue
        try:
            found = socket.getaddrinfo(host.address, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return None
        peers |= {str(info[4][0]) for info in found}
    return peers
