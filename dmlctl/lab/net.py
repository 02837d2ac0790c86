"""The lab's network: one namespace per host joined to a bridge by a veth pair, each
link shaped with ``tc`` in both directions. Everything through ``ip`` and ``tc``
(iproute2); every failed command raises :class:`LabError` with its stderr.

Layout (fixed, so ``down`` finds a lab without its record): namespaces
``dmlctl-lab-<i>``, bridge ``dmlbr0`` at ``10.231.0.1/24`` in the root namespace,
host ``i`` at ``10.231.0.<i+2>`` on ``eth0`` of its namespace, its root-side end
``dmlv<i>`` on the bridge.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import time
from collections.abc import Sequence

from dmlctl.errors import DmlctlError
from dmlctl.lab.rates import burst_bytes, show_rate
from dmlctl.text import plural

NS_PREFIX = "dmlctl-lab-"
BRIDGE = "dmlbr0"
SUBNET = ipaddress.ip_network("10.231.0.0/24")
MAX_HOSTS = 64
TBF_QUEUE_MS = 200
"""How long a packet may wait in the token bucket's queue before it is dropped."""


class LabError(DmlctlError):
    """The lab could not be made or removed; the message says which step and why."""


def namespace(i: int) -> str:
    return f"{NS_PREFIX}{i}"


def address(i: int) -> str:
    """Host ``i``'s address on the lab network."""
    return str(SUBNET.network_address + 2 + i)


def gateway() -> str:
    """The bridge's address: the root namespace on the lab network."""
    return str(SUBNET.network_address + 1)


def run(*argv: str, ns: str | None = None, check: bool = True) -> str:
    """``argv`` (in namespace ``ns``), its stdout; LabError naming the command and its
    stderr when it fails and ``check``."""
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    proc = subprocess.run(full, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        raise LabError(f"`{' '.join(full)}` failed: {why[0]}")
    return proc.stdout


def check_subnet_free() -> None:
    """LabError when a route other than the lab's bridge already covers the subnet."""
    for line in run("ip", "-4", "route", "show").splitlines():
        dest, _, rest = line.partition(" ")
        try:
            net = ipaddress.ip_network(dest, strict=False)
        except ValueError:
            continue
        if net.overlaps(SUBNET) and f"dev {BRIDGE}" not in rest and net.prefixlen > 0:
            raise LabError(f"the lab's subnet {SUBNET} is already in use on this machine: {line}")


def make_bridge(owner: str) -> None:
    """The bridge, up, with :func:`gateway`'s address and ``owner`` (the lab
    directory) as its alias, so another ``up`` can tell whose lab it would remove."""
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "link", "set", "dev", BRIDGE, "alias", owner)
    run("ip", "addr", "add", f"{gateway()}/{SUBNET.prefixlen}", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")


def make_host(i: int) -> None:
    """Namespace ``i`` with ``lo`` and ``eth0`` (:func:`address`) up, its veth peer on
    the bridge."""
    ns, veth, peer = namespace(i), f"dmlv{i}", f"dmlp{i}"
    run("ip", "netns", "add", ns)
    run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
    run("ip", "link", "set", peer, "netns", ns)
    run("ip", "-n", ns, "link", "set", peer, "name", "eth0")
    run("ip", "-n", ns, "addr", "add", f"{address(i)}/{SUBNET.prefixlen}", "dev", "eth0")
    run("ip", "-n", ns, "link", "set", "eth0", "up")
    run("ip", "-n", ns, "link", "set", "lo", "up")
    run("ip", "link", "set", veth, "master", BRIDGE)
    run("ip", "link", "set", veth, "up")


def owner() -> str | None:
    """The lab directory of the lab up now (its bridge's alias); None without a
    bridge, ``""`` for a bridge without one."""
    out = run("ip", "-o", "link", "show", BRIDGE, check=False)
    if not out.strip():
        return None
    _, found, alias = out.partition(" alias ")
    return alias.strip() if found else ""


def has_netem() -> bool:
    """Whether this kernel has the netem queueing discipline (tried on a scratch
    namespace's loopback)."""
    scratch = f"{NS_PREFIX}probe"
    run("ip", "netns", "add", scratch)
    try:
        out = subprocess.run(
            ["ip", "netns", "exec", scratch, "tc", "qdisc", "add", "dev", "lo", "root", "netem"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.returncode == 0
    finally:
        run("ip", "netns", "del", scratch, check=False)


def shape(i: int, bits_per_s: int, latency_ms: float | None) -> None:
    """Host ``i``'s link limited to ``bits_per_s`` both ways (tbf on ``dmlv<i>`` for
    what goes into the host, on its ``eth0`` for what leaves it), with netem's delay
    of ``latency_ms`` in front where given."""
    for dev, ns in ((f"dmlv{i}", None), ("eth0", namespace(i))):
        tbf = [
            "tbf",
            "rate",
            show_rate(bits_per_s),
            "burst",
            str(burst_bytes(bits_per_s)),
            "latency",
            f"{TBF_QUEUE_MS}ms",
        ]
        if latency_ms is None:
            run("tc", "qdisc", "add", "dev", dev, "root", *tbf, ns=ns)
            continue
        delay = f"{latency_ms:g}ms"
        run(
            "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", delay, ns=ns
        )
        run("tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf, ns=ns)


def lab_namespaces() -> list[str]:
    """The lab's namespaces that exist now."""
    names = (line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip())
    return sorted(n for n in names if n.startswith(NS_PREFIX))


def kill_inside(ns: str, grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process in ``ns``, SIGKILL what is left after ``grace_s``; the pids."""
    pids = [int(p) for p in run("ip", "netns", "pids", ns, check=False).split()]
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    _signal([p for p in pids if _alive(p)], signal.SIGKILL)
    return pids


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def remove_network() -> list[str]:
    """Every lab namespace (processes inside killed first; its veth goes with it) and
    the bridge; what was removed, in words."""
    removed = []
    for ns in lab_namespaces():
        killed = kill_inside(ns)
        run("ip", "netns", "del", ns)
        stopped = f" ({plural(len(killed), 'process', 'processes')} stopped)" if killed else ""
        removed.append(f"namespace {ns}{stopped}")
    if run("ip", "link", "show", BRIDGE, check=False).strip():
        run("ip", "link", "del", BRIDGE)
        removed.append(f"bridge {BRIDGE}")
    return removed
