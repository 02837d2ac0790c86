"""Where a parameter server is reached, and how its TCP connections notice a silent
peer.

A server publishes the address of the interface named by ``GLOO_SOCKET_IFNAME`` when
that is set, else the one this machine uses to reach ``MASTER_ADDR`` (the rendezvous
host), so that the servers are found on the network the collectives use.

Every worker↔server connection has TCP keepalive and a user timeout
(:func:`keep_alive`): a peer whose host froze, lost power or was cut off by the
network ends the connection within :data:`SILENT_PEER_S` seconds (its kernel no longer
answers), where TCP alone would leave a reader waiting forever and a writer for about
15 minutes. A peer that is only slow (a long step, a garbage collection, a stopped
process) is not affected: its kernel answers the probes.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

_SIOCGIFADDR = 0x8915
KEEPALIVE_IDLE_S = 10
"""Seconds without traffic before the first keepalive probe."""
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 4
SILENT_PEER_S = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES
"""At most this long after a peer's host stops answering, its connection ends (and
data sent to it stays unacknowledged at most as long: ``TCP_USER_TIMEOUT``)."""


def keep_alive(sock: socket.socket) -> None:
    """Turn on TCP keepalive and the user timeout on ``sock`` (module docstring);
    the options a platform lacks are left as they are."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", SILENT_PEER_S * 1000),
    )
    for name, value in options:
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def advertised_host() -> str:
    """The address other hosts reach this one at (module docstring)."""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if ifname:
        return interface_address(ifname)
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def interface_address(ifname: str) -> str:
    """The IPv4 address of network interface ``ifname`` (Linux); raises OSError with
    the name when it has none."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = struct.pack("256s", ifname.encode()[:15])
        raw = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, packed)
    except OSError as exc:
        raise OSError(f"GLOO_SOCKET_IFNAME={ifname}: no IPv4 address ({exc})") from exc
    finally:
        probe.close()
    return socket.inet_ntoa(raw[20:24])
