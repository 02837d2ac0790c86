"""The parameter-server channel's frames over a real socket pair: headers and
payloads arrive exactly, and a connection that ends says so."""

from __future__ import annotations

import math
import socket

import pytest
import torch

from dmlctl.ps.frames import NO_LR, Connection, ConnectionLost, Op


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
    from dmlctl.ps.frames import HEADER

    out, into = pair
    out.sock.sendall(HEADER.pack(1, 1, 0, 0, 0, -5, 0.0))
    with pytest.raises(ConnectionLost, match="corrupt frame header"):
        into.read_header()
