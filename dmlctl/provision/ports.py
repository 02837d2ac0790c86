"""Rendezvous ports and host liveness: a free port on this machine or on a host, the
rendezvous endpoint of an attempt, and a no-op probe of a host."""

from __future__ import annotations

import socket

from dmlctl.errors import ProvisionError
from dmlctl.plan.model import HostPlan
from dmlctl.transport import network_address
from dmlctl.transport.base import Transport

#: How a plan says that torchrun picks its rendezvous port (an endpoint ending ``:0``).
ANY_FREE_PORT = "torchrun binds a free port as each attempt starts"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def pick_port(transport: Transport, python: str, timeout: float) -> int:
    """A TCP port that was free on the host a moment ago."""
    res = transport.run([python, "-c", _FREE_PORT], timeout=timeout)
    if not res.ok or not res.stdout.strip().isdigit():
        raise ProvisionError(f"{transport.host}: cannot pick a rendezvous port: {res.why()}")
    return int(res.stdout.strip())


def probe_host(host: HostPlan, transport: Transport, timeout: float = 10.0) -> str | None:
    """None when ``host`` answers a no-op command within ``timeout`` seconds, else
    why not (this machine always answers)."""
    if host.is_local:
        return None
    res = transport.run(["true"], timeout=timeout)
    return None if res.ok else res.why(200)


def rendezvous_on(host: HostPlan, transport: Transport, timeout: float = 10.0) -> str:
    """A rendezvous endpoint ``address:port`` on ``host``: its network address and a
    port free there a moment ago. Raises :class:`ProvisionError`."""
    if host.is_local:
        return f"127.0.0.1:{free_port()}"
    port = pick_port(transport, host.python, timeout)
    return f"{network_address(transport, host.address)}:{port}"
