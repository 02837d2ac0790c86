"""The parameter-server channel's frames over a real socket pair: headers and
payloads arrive exactly, and a connection that ends says so."""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Callable

import pytest
import torch

from dmlctl.ps import connection
from dmlctl.ps.connection import NO_LR, Connection, ConnectionLost, Op


@pytest.fixture
def pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair()
    return Connection(a, "worker rank 1"), Connection(b, "parameter server rank 2")


def test_header_carries_the_lr_bits_exactly(pair: tuple[Connection, Connection]) -> None:
    out, into = pair
    for lr in (0.0, 1e-4, 0.1 * 3, 2.5e-7):
        out.send((int(Op.PUSH), 1, 2, 3, 1, lr))
        assert into.read_header() == (int(Op.PUSH), 1, 2, 3, 1, 0, lr)
    out.send((int(Op.DONE), 1, 7, -1, 0, NO_LR))
    header = into.read_header()
    assert header is not None and header[:6] == (int(Op.DONE), 1, 7, -1, 0, 0)
    assert math.isnan(header[6])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_payload_arrives_bit_exact(pair: tuple[Connection, Connection], dtype: torch.dtype) -> None:
    out, into = pair
    sent = (torch.randn(1000) * 100).to(dtype)
    out.send((int(Op.PULL_REPLY), 2, 5, 0, 0, NO_LR), sent)
    header = into.read_header()
    assert header is not None and header[5] == sent.numel() * sent.element_size()
    got = torch.empty(sent.numel(), dtype=dtype)
    into.read_into(got)
    assert torch.equal(got, sent)


def test_a_payload_larger_than_the_socket_buffer_arrives_whole(
    pair: tuple[Connection, Connection],
) -> None:
    import threading

    out, into = pair
    sent = torch.arange(3_000_000, dtype=torch.float32)  # 12 MB: sendall blocks meanwhile
    sender = threading.Thread(target=out.send, args=((int(Op.PUSH), 1, 0, 0, 0, NO_LR), sent))
    sender.start()
    header = into.read_header()
    assert header is not None
    got = into.payload(header[5]).view(torch.float32)
    sender.join()
    assert torch.equal(got, sent)


def test_an_end_between_frames_is_none_and_within_a_frame_an_error(
    pair: tuple[Connection, Connection],
) -> None:
    out, into = pair
    out.close()
    assert into.read_header() is None
    a, b = socket.socketpair()
    a.sendall(b"\x01\x00\x00")  # three bytes of a 56-byte header, then the end
    a.close()
    with pytest.raises(ConnectionLost, match="worker rank 3: Connection closed by peer"):
        Connection(b, "worker rank 3").read_header()


def test_a_corrupt_size_is_refused(pair: tuple[Connection, Connection]) -> None:
    from dmlctl.ps.connection import HEADER

    out, into = pair
    out.sock.sendall(HEADER.pack(1, 1, 0, 0, 0, -5, 0.0))
    with pytest.raises(ConnectionLost, match="corrupt frame header"):
        into.read_header()


def test_a_replacements_hello_takes_over_and_the_old_connections_end_is_dropped(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from datetime import timedelta

    from torch._C._distributed_c10d import TCPStore

    from dmlctl.ps.frames import Endpoint

    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    port = master.port  # bound by the store itself: no other process can take it first
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    server = Endpoint(2)
    address = server._listener.getsockname()

    def connect(hello: bool) -> Connection:
        conn = Connection(socket.create_connection(address), "parameter server rank 2")
        if hello:
            conn.send((int(Op.HELLO), 1, 0, -1, 0, NO_LR))
        return conn

    stranger = connect(hello=False)
    stranger.sock.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(60))
    assert stranger.read_header() is None  # closed by the server, which goes on
    old = connect(hello=True)
    old.send((int(Op.PULL), 1, 3, 0, 0, NO_LR))
    assert [server.get()[0][0] for _ in range(2)] == [Op.HELLO, Op.PULL]
    new = connect(hello=True)
    assert server.get()[0][0] == Op.HELLO
    assert old.read_header() is None  # the replaced connection was closed
    new.send((int(Op.DONE), 1, 4, -1, 0, NO_LR))
    header, _, worker = server.get()  # not the old connection's LEFT
    assert (header[0], header[2], worker) == (Op.DONE, 4, 1)
    server.send(1, (int(Op.PULL_REPLY), 2, 0, 0, 0, NO_LR))
    assert new.read_header() is not None  # replies go to the replacement
    new.close()
    assert server.get()[0][0] == Op.LEFT  # its own end before CLOSE is one
    assert "connected without a HELLO" in capfd.readouterr().err
    server.close()
    del master


def test_a_reader_waiting_on_a_replaced_peer_stops_waiting(
    pair: tuple[Connection, Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen server keeps its socket open: the worker waiting for its reply asks
    meanwhile whether a newer server took over, and then reads as if the connection
    broke (and goes to the replacement); until then it waits."""
    monkeypatch.setattr(connection, "SUPERSEDED_POLL_S", 0.02)
    worker, server = pair
    asked: list[bool] = []
    worker.superseded = _replaced_at(5, asked)
    with pytest.raises(ConnectionLost, match=r"Connection reset by peer .*newer process"):
        worker.read_header()
    assert len(asked) == 5
    worker.superseded = lambda: False
    server.send((int(Op.PULL), 1, 2, 3, 4, 0.5))  # a live peer's frame still arrives
    assert worker.read_header() == (int(Op.PULL), 1, 2, 3, 4, 0, 0.5)


def test_a_sender_blocked_on_a_replaced_peer_stops_waiting(
    pair: tuple[Connection, Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen server reads nothing: a push larger than the sockets' buffers stays
    half sent. The worker asks meanwhile whether a newer server took over, and then
    fails as if the connection broke (and sends to the replacement); a peer that reads
    gets the whole payload, however the socket split it."""
    monkeypatch.setattr(connection, "SUPERSEDED_POLL_S", 0.02)
    worker, _ = pair
    asked: list[bool] = []
    worker.superseded = _replaced_at(3, asked)
    big = torch.arange(4 << 20, dtype=torch.uint8)  # 4 MiB: more than the buffers hold
    with pytest.raises(ConnectionLost, match=r"Connection closed by peer .*newer process"):
        worker.send((int(Op.PUSH), 1, 2, 3, 4, 0.5), big)
    assert len(asked) == 3
    a, b = socket.socketpair()
    sender, reader = Connection(a, "worker rank 1"), Connection(b, "parameter server rank 2")
    sender.superseded = lambda: False
    done = threading.Thread(target=sender.send, args=((int(Op.PUSH), 1, 2, 3, 4, 0.5), big))
    done.start()
    header = reader.read_header()
    assert header is not None and header[5] == big.numel()
    got = reader.payload(header[5])
    done.join(10)
    assert torch.equal(got, big)


def _replaced_at(n: int, asked: list[bool]) -> Callable[[], bool]:
    """A ``superseded`` that says yes at its ``n``-th question (each one noted in
    ``asked``)."""

    def superseded() -> bool:
        asked.append(True)
        return len(asked) >= n

    return superseded
