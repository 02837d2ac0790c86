"""Transports: how commands reach a host (see :mod:`dmlctl.transport.base`)."""

from __future__ import annotations

from dmlctl.errors import UsageError
from dmlctl.plan.model import HostPlan
from dmlctl.transport.base import Process, Result, Transport
from dmlctl.transport.local import LocalTransport


def transport_for(host: HostPlan) -> Transport:
    """The transport for a planned host; raises UsageError for a host this build
    cannot reach."""
    if host.is_local:
        return LocalTransport(host.name)
    raise UsageError(
        f"host {host.name!r} ({host.address}) is a remote host; this version of dmlctl runs"
        " jobs on this machine only (use 'address: localhost' or omit --cluster)"
    )


__all__ = ["LocalTransport", "Process", "Result", "Transport", "transport_for"]
