"""Values of any size in the run's store (:mod:`dmlctl.runtime.store_blobs`), on a
real TCPStore: torch's refuses a value over 8 MiB (and breaks its client)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch._C._distributed_c10d import TCPStore

from dmlctl.ps.snapshots import Snapshots
from dmlctl.runtime import rejoin, store_blobs
from dmlctl.runtime.signed_store import SignedStore


@pytest.fixture
def store() -> SignedStore:
    return SignedStore(TCPStore("127.0.0.1", 0, 1, True))


def test_a_blob_over_the_stores_limit_goes_in_pieces_and_comes_back_whole(
    store: SignedStore,
) -> None:
    assert store_blobs.get(store, "snap") is None
    big = os.urandom(9 << 20)  # over the 8 MiB a value may be
    store_blobs.put(store, "snap", big)
    assert store_blobs.get(store, "snap") == big
    small = b"\x00\x01" * 10
    store_blobs.put(store, "snap", small)  # the next generation replaces it
    assert store_blobs.get(store, "snap") == small
    assert not store.check(["snap/1/0"]) and not store.check(["snap/1/2"])  # old pieces gone
    store_blobs.put(store, "empty", b"")
    assert store_blobs.get(store, "empty") == b""


def test_a_snapshot_copy_the_store_refuses_is_given_up_and_the_file_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: SignedStore
) -> None:
    monkeypatch.setattr(rejoin, "store", lambda: store)
    said: list[str] = []
    monkeypatch.setattr(rejoin, "say", said.append)
    snapshots = Snapshots(str(tmp_path), 2, every=1, copied=True)
    snapshots.write({"params": {0: torch.ones(3)}}, 5)
    elsewhere = Snapshots(str(tmp_path / "elsewhere"), 2, every=1, copied=True)
    assert torch.equal(elsewhere.read()["params"][0], torch.ones(3))  # from the store's copy

    def refuse(*_: object) -> None:
        raise RuntimeError("Invalid payload size")

    monkeypatch.setattr(store_blobs, "put", refuse)
    snapshots.write({"params": {0: torch.zeros(3)}}, 6)
    assert snapshots.key is None and "given up" in said[0]
    assert torch.equal(snapshots.read()["params"][0], torch.zeros(3))  # the file has it


def test_a_server_replaced_meanwhile_leaves_the_stores_copy_to_its_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: SignedStore
) -> None:
    """A frozen server thawed after its replacement started must not overwrite the
    replacement's copies with its older state."""
    monkeypatch.setattr(rejoin, "store", lambda: store)
    said: list[str] = []
    monkeypatch.setattr(rejoin, "say", said.append)
    for where in ("old", "new", "elsewhere"):
        (tmp_path / where).mkdir()
    old = Snapshots(str(tmp_path / "old"), 2, every=1, copied=True)
    new = Snapshots(str(tmp_path / "new"), 2, every=1, copied=True)
    new.write({"params": {0: torch.ones(3)}}, 9)
    old.superseded = lambda: True
    old.write({"params": {0: torch.zeros(3)}}, 5)
    assert old.key is None and "replaced meanwhile" in said[0]
    elsewhere = Snapshots(str(tmp_path / "elsewhere"), 2, every=1, copied=True)
    assert torch.equal(elsewhere.read()["params"][0], torch.ones(3))
