"""Whether the hosts of a run can reach this machine, where the controller would hold
the run's store (:mod:`dmlctl.provision.store_server`).

A run that replaces lost hosts in place keeps its store in the controller, so that
no training host serves it; that needs every host to reach this machine. The address
offered is the one this machine uses on its route to the run's first remote host (the
network the hosts share with it), and each host is asked to connect to it, all at
once, within the connect timeout, before anything starts. A host that cannot leaves the
store with rank 0's host, as torchrun keeps it (:func:`store_host`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dmlctl.provision import probe
from dmlctl.provision.doctor import CONNECT_TIMEOUT
from dmlctl.spec.models import ResolvedHost
from dmlctl.transport import network_address
from dmlctl.transport.base import Transport

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class StoreHost:
    """Where the controller holds the run's store (None: on rank 0's host, as torchrun
    does) and, when it cannot, why (one line)."""

    address: str | None
    why_not: str | None = None


def controller_address(toward: str) -> str:
    """This machine's address on its route to ``toward`` (a host's network address);
    the loopback address for a loopback host, and when no route is found."""
    try:
        target = socket.getaddrinfo(toward, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except (OSError, IndexError):
        return LOOPBACK
    if ipaddress.ip_address(target).is_loopback:
        return LOOPBACK
    probe_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe_sock.connect((target, 9))  # UDP: nothing is sent, the kernel picks the route
        return str(probe_sock.getsockname()[0])
    except OSError:
        return LOOPBACK
    finally:
        probe_sock.close()


class _Greeter:
    """A listener on ``address`` (a free port) that greets every connection as the
    rendezvous listener does, so that the connect probe knows it reached it."""

    def __init__(self, address: str) -> None:
        self._sock = socket.create_server((address, 0))
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._greet, name="dmlctl-reach", daemon=True)
        self._thread.start()

    def _greet(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), conn:
                conn.sendall(probe.GREETING.encode() + b"\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(2.0)


def unreachable(
    hosts: Sequence[ResolvedHost],
    transports: Mapping[str, Transport],
    address: str,
    timeout: float,
    clock: Callable[[], float] = time.time,
) -> dict[str, str]:
    """The hosts of ``hosts`` that cannot connect to this machine at ``address``, with
    why (each asked at once, within ``timeout`` seconds); empty when every one can.
    Raises OSError when this machine cannot listen there."""
    greeter = _Greeter(address)
    try:
        wait = min(CONNECT_TIMEOUT, timeout)
        calls = {
            h.name: (transports[h.name], probe.connect_argv(h, address, greeter.port, wait))
            for h in hosts
        }
        answers = probe.fan_out(calls, timeout=timeout, clock=clock)
    finally:
        greeter.close()
    failed: dict[str, str] = {}
    for name, answer in answers.items():
        if isinstance(answer, str):
            failed[name] = answer
        elif not (answer.result.ok and _last_line(answer.result.stdout) == "ok"):
            lines = (answer.result.stdout + answer.result.stderr).strip().splitlines()
            failed[name] = lines[-1] if lines else f"exit code {answer.result.exit_code}"
    return failed


def _last_line(text: str) -> str:
    """The last line that says something (a shell profile may print before it)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def store_host(
    hosts: Sequence[ResolvedHost],
    transports: Mapping[str, Transport],
    timeout: float,
    clock: Callable[[], float] = time.time,
) -> StoreHost:
    """Where the controller holds the store of a run on ``hosts`` (placed hosts and
    spares): the loopback address when every one is this machine, else this machine's
    address toward the first remote host when every remote host reached it."""
    remote = [h for h in hosts if not h.is_local]
    if not remote:
        return StoreHost(LOOPBACK)
    address = controller_address(network_address(transports[remote[0].name], remote[0].address))
    try:
        failed = unreachable(remote, transports, address, timeout, clock)
    except OSError as e:
        return StoreHost(None, f"this machine cannot listen at {address}: {e}")
    if failed:
        name, why = next(iter(failed.items()))
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return StoreHost(None, f"{name}{more} cannot reach this machine at {address}: {why}")
    return StoreHost(address)
