"""A parameter-server connection to a host that stops answering ends by itself
(TCP keepalive), instead of leaving its reader waiting forever.

The peer is a real process in a network namespace of its own, reached over a veth
pair; it falls silent when its end of the pair goes down (as a frozen or unplugged
host would: its kernel answers nothing more)."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dmlctl.ps import addresses
from dmlctl.ps.connection import Connection, ConnectionLost

PEER = "10.250.77.2"
HERE = "10.250.77.1"
LISTENER = """
import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
conn, _ = s.accept()
time.sleep(120)
"""


def _ip(*argv: str, ns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    subprocess.run([*prefix, "ip", *argv], check=True, capture_output=True)


@pytest.fixture
def peer_ns() -> Iterator[str]:
    """A namespace at ``PEER`` linked to this one at ``HERE`` (root and iproute2)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (network namespaces)")
    ns, here, there = f"dmlka{os.getpid()}", f"ka{os.getpid()}a", f"ka{os.getpid()}b"
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"{HERE}/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("addr", "add", f"{PEER}/30", "dev", there, ns=ns)
        _ip("link", "set", there, "up", ns=ns)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", here], capture_output=True)


def test_a_connection_to_a_host_that_falls_silent_ends_within_the_keepalive_time(
    peer_ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(addresses, "KEEPALIVE_IDLE_S", 1)
    monkeypatch.setattr(addresses, "KEEPALIVE_INTERVAL_S", 1)
    monkeypatch.setattr(addresses, "KEEPALIVE_PROBES", 2)
    monkeypatch.setattr(addresses, "SILENT_PEER_S", 3)
    argv = ["ip", "netns", "exec", peer_ns, sys.executable, "-c", LISTENER, PEER]
    listener = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        conn = Connection(socket.create_connection((PEER, port), timeout=5), "server")
        conn.sock.settimeout(30)  # the test's own bound: keepalive must end it first
        assert conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        time.sleep(1.5)  # a probe answered: a quiet but live peer keeps its connection
        assert select.select([conn.sock], [], [], 0)[0] == []  # no end, no error
        _ip("link", "set", f"ka{os.getpid()}b", "down", ns=peer_ns)
        start = time.monotonic()
        with pytest.raises(ConnectionLost, match="Connection timed out"):
            conn.read_header()
        assert time.monotonic() - start < 8
    finally:
        listener.kill()
        listener.wait()
