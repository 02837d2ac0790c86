"""Where the controller holds the store of a run replaced in place
(:mod:`dmlctl.provision.store_reach`): this machine's address toward the hosts, once
every host connected to it."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from dmlctl.provision.store_reach import LOOPBACK, StoreHost, controller_address, store_host
from dmlctl.transport import LocalTransport
from dmlctl.transport.base import Result
from dmlctl.transport.fake import ScriptedTransport
from tests.unit.test_doctor import host


def test_the_address_toward_a_loopback_or_unknown_host_is_the_loopback() -> None:
    assert controller_address("127.0.0.5") == LOOPBACK
    assert controller_address("no-such-host.invalid") == LOOPBACK


def test_local_hosts_need_no_question() -> None:
    a = host("a", "localhost", is_local=True)
    assert store_host([a], {"a": ScriptedTransport("a")}, timeout=5) == StoreHost(LOOPBACK)


def test_every_remote_host_connects_to_this_machine_before_the_store_is_held_here() -> None:
    """Each remote host runs the connect probe against a listener here (host b runs it
    on this machine: a loopback host); one that cannot (c's transport answers nothing)
    leaves the store with rank 0's host, saying why."""
    b = host("b", "127.0.0.2", python=sys.executable)
    found = store_host([b], {"b": LocalTransport("b")}, timeout=20)
    assert found == StoreHost(LOOPBACK)
    c = host("c", "127.0.0.3")
    transports = {"b": LocalTransport("b"), "c": ScriptedTransport("c")}
    found = store_host([b, c], transports, timeout=20)
    assert found.address is None and found.why_not is not None
    assert found.why_not.startswith("c cannot reach this machine at 127.0.0.1: not scripted")


class _Profiled:
    """A host whose login shell prints a banner before every command's output."""

    def __init__(self) -> None:
        self.local = LocalTransport("d")

    def run(self, argv: Sequence[str], **kw: Any) -> Result:
        result = self.local.run(argv, **kw)
        return dataclasses.replace(result, stdout="Welcome to d!\n" + result.stdout + "\n")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)


def test_a_login_banner_does_not_hide_that_a_host_reached_this_machine() -> None:
    d = host("d", "127.0.0.4", python=sys.executable)
    assert store_host([d], {"d": _Profiled()}, timeout=20) == StoreHost(LOOPBACK)  # type: ignore[dict-item]
