"""Transports: how commands reach a host (see :mod:`dmlctl.transport.base`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from dmlctl.transport.base import Process, Result, Transport
from dmlctl.transport.local import LocalTransport

if TYPE_CHECKING:
    from dmlctl.transport.ssh import SshOptions


class Reachable(Protocol):
    """What a transport needs to know about a host (ResolvedHost and HostPlan have it)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def user(self) -> str | None: ...
    @property
    def identity_file(self) -> str | None: ...
    @property
    def is_local(self) -> bool: ...


def make_transports(
    hosts: Iterable[Reachable], options: SshOptions | None = None
) -> dict[str, Transport]:
    """One transport per host: LocalTransport for ``localhost``, SSH otherwise.

    Opens no connection (SSH connects on first use). fabric is imported only when
    a host is remote, so local runs never pay for it.
    """
    out: dict[str, Transport] = {}
    for host in hosts:
        if host.is_local:
            out[host.name] = LocalTransport(host.name)
            continue
        from dmlctl.transport.ssh import SshOptions, SSHTransport

        out[host.name] = SSHTransport(
            host.name,
            host.address,
            port=host.port,
            user=host.user,
            identity_file=host.identity_file,
            options=options if options is not None else SshOptions(),
        )
    return out


def network_address(transport: Transport, address: str) -> str:
    """The name other hosts use to reach this host: the SSH transport's resolved
    ``HostName`` when ``address`` is an ~/.ssh/config alias, else ``address``."""
    resolved = getattr(transport, "hostname", None)
    return resolved if isinstance(resolved, str) and resolved else address


def ssh_route(transport: Transport) -> str | None:
    """``user@hostname:port [via JUMP]`` of an SSH transport, as ~/.ssh/config
    resolves it (nothing is connected); None for a local one."""
    route = getattr(transport, "route", None)
    return route if isinstance(route, str) else None


def close_transports(transports: dict[str, Transport]) -> None:
    """Close what holds a connection (SSH); harmless for the others."""
    for t in transports.values():
        close = getattr(t, "close", None)
        if callable(close):
            close()


__all__ = [
    "LocalTransport",
    "Process",
    "Reachable",
    "Result",
    "Transport",
    "close_transports",
    "make_transports",
    "network_address",
    "ssh_route",
]
