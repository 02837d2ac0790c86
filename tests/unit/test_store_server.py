"""The controller's store (:mod:`dmlctl.provision.store_server`) answers torch's own
``TCPStore`` client as torch's server does, and keeps one bad client to itself.

torch's client runs in a process of its own: some of its calls block with the GIL held,
which would stop a server thread in the same process."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from dmlctl.provision import store_server as ss
from dmlctl.provision import store_wire as wire

CLIENT = textwrap.dedent(
    """
    import json, sys, threading, time
    from datetime import timedelta
    import torch.distributed as dist

    port = int(sys.argv[1])
    def client(timeout=5.0):
        return dist.TCPStore("127.0.0.1", port, is_master=False,
                             timeout=timedelta(seconds=timeout), wait_for_workers=False)
    c, out = client(), {}
    c.set("a", b"1"); out["get"] = c.get("a").decode()
    out["add"] = [c.add("n", 5), c.add("n", -2), c.get("n").decode()]
    out["check"] = [c.check(["a"]), c.check(["a", "zz"])]
    out["compare_set"] = [c.compare_set(k, e, n).decode() for k, e, n in (
        ("cs", b"", b"x"), ("cs", b"y", b"z"), ("cs", b"x", b"z"), ("absent", b"q", b"w"))]
    c.append("ap", b"ab"); c.append("ap", b"cd"); out["append"] = c.get("ap").decode()
    c.multi_set(["m1", "m2"], [b"1", b"2"])
    out["multi_get"] = [v.decode() for v in c.multi_get(["m1", "m2"])]
    n = c.num_keys()
    out["delete"] = [c.delete_key("m1"), c.delete_key("m1"), c.num_keys() - n]
    if hasattr(c, "queue_push"):  # torch's client has the queue calls from 2.6 on
        c.queue_push("q", b"a"); c.queue_push("q", b"b")
        out["queue"] = [c.queue_len("q"), c.queue_pop("q").decode(), c.queue_len("q")]
    out["torch"] = __import__("torch").__version__
    t0 = time.monotonic()
    try:
        c.wait(["never"], timedelta(seconds=0.3))
        out["wait_timeout"] = None
    except Exception as e:
        out["wait_timeout"] = [type(e).__name__, round(time.monotonic() - t0, 1)]
    c.set("after", b"ok"); out["after_cancel"] = c.get("after").decode()
    threading.Timer(0.3, lambda: client().set("w", b"1")).start()
    c.wait(["w", "a"]); out["woken"] = c.get("w").decode()
    big = bytes(range(256)) * (8 * 1024 * 4)  # 8 MiB, torch's largest value
    c.set("big", big); out["big"] = c.get("big") == big
    print(json.dumps(out))
    """
)


@pytest.fixture
def server() -> Iterator[ss.StoreServer]:
    with ss.StoreServer() as s:
        yield s


@pytest.mark.compat  # every torch the project declares: its client speaks to this server
def test_torchs_client_is_answered_as_by_torchs_own_server(server: ss.StoreServer) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, str(server.port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["get"] == "1"
    assert out["add"] == [5, 3, "3"]
    assert out["check"] == [True, False]
    assert out["compare_set"] == ["x", "x", "z", "q"]
    assert out["append"] == "abcd"
    assert out["multi_get"] == ["1", "2"]
    assert out["delete"] == [True, False, -1]
    assert out.get("queue", [2, "a", 1]) == [2, "a", 1]
    assert "queue" in out or out["torch"].startswith(("2.4.", "2.5."))
    assert out["wait_timeout"][0] == "DistStoreError" and out["wait_timeout"][1] < 3
    assert out["after_cancel"] == "ok"  # a cancelled wait leaves the connection usable
    assert out["woken"] == "1" and out["big"] is True
    assert server.snapshot()["/a"] == b"1"  # torch's client puts its "/" before each key


# A client of the wire protocol, without torch: what torch's client sends.
def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(bytes([wire.VALIDATE]) + struct.pack("<I", wire.MAGIC))
    return sock


def _key(k: str) -> bytes:
    return struct.pack("<Q", len(k)) + k.encode()


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_wait_is_answered_when_its_last_key_comes_and_a_cancel_after_it(
    server: ss.StoreServer,
) -> None:
    waiter, setter = _connect(server.port), _connect(server.port)
    waiter.sendall(bytes([wire.WAIT]) + struct.pack("<Q", 2) + _key("x") + _key("y"))
    setter.sendall(bytes([wire.SET]) + _key("x") + _key("1"))
    waiter.settimeout(0.3)
    with pytest.raises(TimeoutError):
        waiter.recv(1)  # one of two keys: still waiting
    setter.sendall(bytes([wire.SET]) + _key("y") + _key("2"))
    waiter.settimeout(5)
    assert waiter.recv(1) == wire.STOP_WAITING
    waiter.sendall(bytes([wire.CANCEL_WAIT]))  # a client that gave up meanwhile
    assert waiter.recv(1) == wire.WAIT_CANCELED


def test_a_bad_client_is_closed_and_the_others_go_on(server: ss.StoreServer) -> None:
    unvalidated = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    unvalidated.sendall(bytes([wire.SET]) + _key("k") + _key("v"))
    assert _closed(unvalidated) and "k" not in server.snapshot()
    huge = _connect(server.port)
    huge.sendall(bytes([wire.SET]) + struct.pack("<Q", wire.MAX_KEY + 1))
    assert _closed(huge)
    unknown = _connect(server.port)
    unknown.sendall(bytes([250]))
    assert _closed(unknown)
    good = _connect(server.port)
    good.sendall(bytes([wire.ADD]) + _key("n") + struct.pack("<q", 7))
    assert struct.unpack("<q", good.recv(8))[0] == 7


def test_close_ends_every_connection_and_the_listener(server: ss.StoreServer) -> None:
    sock = _connect(server.port)
    threading.Timer(0.1, server.close).start()
    start = time.monotonic()
    assert _closed(sock) and time.monotonic() - start < 3
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)


def _wait_key(sock: socket.socket, key: str) -> None:
    sock.sendall(bytes([wire.WAIT]) + struct.pack("<Q", 1) + _key(key))


def _answered(sock: socket.socket, within: float) -> bytes:
    sock.settimeout(within)
    try:
        return sock.recv(1)
    except TimeoutError:
        return b""


def test_every_waiter_of_a_key_wakes_and_one_that_left_is_forgotten(
    server: ss.StoreServer,
) -> None:
    gone, first, second = (_connect(server.port) for _ in range(3))
    for sock in (gone, first, second):
        _wait_key(sock, "k")
    gone.close()  # a client that died while it waited
    time.sleep(0.1)
    setter = _connect(server.port)
    setter.sendall(bytes([wire.SET]) + _key("k") + _key("v"))
    assert _answered(first, 5) == wire.STOP_WAITING and _answered(second, 5) == wire.STOP_WAITING


def test_a_queue_push_wakes_one_waiter_only(server: ss.StoreServer) -> None:
    first, second, pusher = (_connect(server.port) for _ in range(3))
    _wait_key(first, "q")
    _wait_key(second, "q")
    time.sleep(0.1)
    pusher.sendall(bytes([wire.QUEUE_PUSH]) + _key("q") + _key("a"))
    woken = [s for s in (first, second) if _answered(s, 1) == wire.STOP_WAITING]
    assert len(woken) == 1
    pusher.sendall(bytes([wire.QUEUE_PUSH]) + _key("q") + _key("b"))
    (other,) = [s for s in (first, second) if s is not woken[0]]
    assert _answered(other, 5) == wire.STOP_WAITING


def test_an_add_past_int64_closes_that_client_only(server: ss.StoreServer) -> None:
    big = _connect(server.port)
    big.sendall(bytes([wire.ADD]) + _key("n") + struct.pack("<q", 2**63 - 1))
    assert struct.unpack("<q", big.recv(8))[0] == 2**63 - 1
    big.sendall(bytes([wire.ADD]) + _key("n") + struct.pack("<q", 1))
    assert _closed(big)
    other = _connect(server.port)
    other.sendall(bytes([wire.GET]) + _key("n"))
    assert other.recv(8) == struct.pack("<Q", 19)  # untouched: len("9223372036854775807")


def test_a_client_from_outside_the_cluster_is_closed_and_named() -> None:
    """Bound where every address of this machine reaches it, allowing one peer address
    only: a client from another address is closed before anything it sends is read."""
    refused: list[str] = []
    with ss.StoreServer("0.0.0.0", peers={"127.0.0.2"}, refused=refused.append) as server:
        stranger = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with contextlib.suppress(OSError):  # closed before or as it sends
            stranger.sendall(bytes([wire.VALIDATE]) + struct.pack("<I", wire.MAGIC))
            stranger.sendall(bytes([wire.SET]) + _key("k") + _key("v"))
        assert _closed(stranger) and "k" not in server.snapshot()
        member = socket.create_connection(
            ("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.2", 0)
        )
        member.sendall(bytes([wire.VALIDATE]) + struct.pack("<I", wire.MAGIC))
        member.sendall(bytes([wire.ADD]) + _key("n") + struct.pack("<q", 3))
        assert struct.unpack("<q", member.recv(8))[0] == 3
    assert refused == ["a connection from 127.0.0.1, which is none of the run's hosts"]


def test_connections_over_the_cap_are_closed_and_the_others_served() -> None:
    refused: list[str] = []
    with ss.StoreServer(max_clients=3, refused=refused.append) as server:
        held = [_connect(server.port) for _ in range(3)]
        deadline = time.monotonic() + 5
        while len(server._clients) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        assert _closed(extra)
        held[0].sendall(bytes([wire.ADD]) + _key("n") + struct.pack("<q", 1))
        assert struct.unpack("<q", held[0].recv(8))[0] == 1  # the run goes on
    assert refused == ["a connection from 127.0.0.1 over the 3 served at once"]


def test_a_signed_set_is_in_the_store_when_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's client sends a set and goes on; the store serves each connection on a
    thread of its own. A rank's 'joined' mark, looked for on another connection, was
    missing (its set not yet served): SignedStore's set returns once it is held."""
    from torch._C._distributed_c10d import TCPStore

    from dmlctl.runtime.signed_store import SignedStore

    real = ss.StoreServer._set

    def slow(self: ss.StoreServer, client: object, reader: object) -> None:
        time.sleep(0.5)  # a loaded machine: the set's thread runs late
        real(self, client, reader)  # type: ignore[arg-type]

    monkeypatch.setitem(ss._HANDLERS, wire.SET, slow)
    with ss.StoreServer() as server:
        writer = SignedStore(TCPStore("127.0.0.1", server.port, is_master=False))
        reader = TCPStore("127.0.0.1", server.port, is_master=False)
        writer.set("joined/0", "1")
        assert reader.check(["joined/0"])  # seen at once from another connection
        writer.raw.set("bare/0", "1")  # torch's own set: not yet
        assert not reader.check(["bare/0"])
