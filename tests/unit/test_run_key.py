"""The run key (dmlctl.run_key): signed store values, and the parameter-server
handshake in which a worker and a server prove to each other that both hold it."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from dmlctl import run_key
from dmlctl.protocol import ENV_RUN_KEY_FILE
from dmlctl.ps import handshake
from dmlctl.ps.connection import NO_LR, Connection, Op


@pytest.fixture
def keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    path = run_key.write_key(str(tmp_path), run_key.new_key())
    assert oct(Path(path).stat().st_mode)[-3:] == "600"
    monkeypatch.setenv(ENV_RUN_KEY_FILE, path)
    key = run_key.key()
    assert key is not None and len(key) == 32
    return key


def test_only_a_value_signed_with_the_run_key_verifies(keyed: bytes) -> None:
    signed = run_key.sign(b"10.0.0.5:4242 1")
    assert run_key.verify(signed) == b"10.0.0.5:4242 1"
    assert run_key.verify(b"10.0.0.9:1 99") is None  # written by a process without the key
    forged = run_key.sign(b"10.0.0.9:1 99", run_key.proof(b"other", b"x"))
    assert run_key.verify(forged) is None
    assert run_key.verify(signed[:-1] + b"2") is None  # altered after signing
    assert run_key.verify(b"zz" * 32 + b" v") is None


def test_a_signed_value_verifies_only_under_its_own_name(keyed: bytes) -> None:
    signed = run_key.sign(b"1", name="dmlctl/rejoin/0/finished/1")
    assert run_key.verify(signed, name="dmlctl/rejoin/0/finished/1") == b"1"
    assert run_key.verify(signed, name="dmlctl/rejoin/0/elastic/gone/1") is None  # replayed


def test_the_store_signs_what_it_writes_and_acts_on_nothing_forged(keyed: bytes) -> None:
    """Through a real torch store: a value written raw (another process, without the
    key) or copied from another key is never returned; looked for, it is removed and
    counts as missing, and a wait goes on until the real writer's value is there."""
    from datetime import timedelta

    import torch.distributed as dist

    from dmlctl.runtime.signed_store import ForgedValue, SignedStore

    raw = dist.HashStore()
    store = SignedStore(raw)
    store.set("ps/2", "10.0.0.5:4242 1")
    assert store.get("ps/2") == b"10.0.0.5:4242 1" and raw.get("ps/2") != b"10.0.0.5:4242 1"
    raw.set("ps/2", "10.6.6.6:1 9")  # the attacker's address
    with pytest.raises(ForgedValue, match="'ps/2'"):
        store.get("ps/2")
    store.set("gone/0", "1")
    raw.set("gone/1", raw.get("gone/0"))  # a real signature, under another key
    assert store.check(["gone/0"]) and not store.check(["gone/0", "gone/1"])
    assert not raw.check(["gone/1"])  # removed
    raw.set("done/3", "1")
    later = threading.Timer(0.3, store.set, ("done/3", "1"))
    later.start()
    store.wait(["done/3"], timedelta(seconds=10))  # past the forgery, to the real one
    later.join()
    assert store.get("done/3") == b"1"
    assert store.compare_set("members", "", "[0, 1]") == b"[0, 1]"
    assert store.compare_set("members", "", "[0]") == b"[0, 1]"  # the first decision stays
    assert store.add("count", 2) == 2 and raw.get("count") == b"2"  # a counter, as it is


def test_without_a_key_nothing_is_signed_or_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_RUN_KEY_FILE, raising=False)
    assert run_key.sign(b"v") == b"v" and run_key.verify(b"v") == b"v"


def _pair() -> tuple[Connection, Connection]:
    a, b = socket.socketpair()
    return Connection(a, "server"), Connection(b, "worker")


def _fake_server(conn: Connection, key: bytes) -> None:
    """A server that took the address without the run key: it answers with a proof
    made with a key of its own."""
    header = conn.read_header()
    assert header is not None
    theirs = conn.payload(header[5]).numpy().tobytes()
    mine = b"n" * run_key.NONCE_BYTES
    proof = run_key.proof(key, handshake.SERVER, theirs, mine)
    conn.send((int(Op.HELLO), 2, 0, -1, 0, NO_LR), handshake._tensor(mine + proof))


def test_both_ends_holding_the_key_meet(keyed: bytes) -> None:
    server, worker = _pair()
    result: list[bool] = []

    def serve() -> None:
        header = server.read_header()
        assert header is not None and header[0] == Op.HELLO
        result.append(handshake.server_hello(server, 2, server.payload(header[5])))

    t = threading.Thread(target=serve)
    t.start()
    handshake.worker_hello(worker, (int(Op.HELLO), 1, 0, -1, 0, NO_LR))
    t.join(10)
    assert result == [True]


def test_a_worker_refuses_a_server_without_the_key(keyed: bytes) -> None:
    server, worker = _pair()
    t = threading.Thread(target=_fake_server, args=(server, b"not the run key"))
    t.start()
    with pytest.raises(handshake.Impostor, match="could not prove it holds the run's key"):
        handshake.worker_hello(worker, (int(Op.HELLO), 1, 0, -1, 0, NO_LR))
    t.join(10)


def test_a_server_closes_a_worker_without_the_key(
    keyed: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, worker = _pair()
    result: list[bool] = []

    def serve() -> None:
        header = server.read_header()
        assert header is not None
        result.append(handshake.server_hello(server, 2, server.payload(header[5])))

    t = threading.Thread(target=serve)
    t.start()
    # the impostor's worker: a nonce, then a proof made with another key
    mine = b"w" * run_key.NONCE_BYTES
    worker.send((int(Op.HELLO), 1, 0, -1, 0, NO_LR), handshake._tensor(mine))
    answer = handshake._answer(worker)
    theirs = answer[: run_key.NONCE_BYTES]
    bad = run_key.proof(b"guess", handshake.WORKER, theirs, mine)
    worker.send((int(Op.HELLO), 1, 0, -1, 0, NO_LR), handshake._tensor(bad))
    t.join(10)
    assert result == [False]
