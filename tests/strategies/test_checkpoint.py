"""Checkpoints: atomic commit, verified fallback, safe loading, exact resume (gloo ranks)."""

from __future__ import annotations

import json
import os
import random
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from dmlctl.checkpoint_files import sha256_file
from dmlctl.runtime import checkpoint as ckpt
from dmlctl.runtime.checkpoint import CheckpointManager, CheckpointRefused, CheckpointWarning
from dmlctl.runtime.checkpoint_dir import CheckpointForeign
from tests.mounts import tmpfs
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration


def _state(step: int) -> dict[str, Any]:
    return {"w": torch.full((3,), float(step)), "step": step}


def _mgr(root: Path, **kw: Any) -> CheckpointManager:
    return CheckpointManager(str(root), 0, 1, **kw)


# ---------------------------------------------------------------- single process


def test_round_trip_model_optimizer_rng_and_position(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    random.seed(3)
    state = ckpt.training_state(model, opt, epoch=2, batches=5, extra={"best": 0.5})
    expect = (torch.rand(3), random.random())
    mgr = _mgr(tmp_path)
    path = mgr.save(7, state)
    assert Path(path).name == "step-000000007"
    assert (tmp_path / "LATEST").read_text() == "step-000000007"

    model2 = torch.nn.Linear(4, 2)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    found = _mgr(tmp_path).load_latest()
    assert found is not None
    step, loaded = found
    ckpt.restore_training_state(loaded, model2, opt2)
    assert step == 7 and loaded["data"] == {"epoch": 2, "batches": 5}
    assert loaded["extra"] == {"best": 0.5}
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    buf = opt2.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(buf, opt.state_dict()["state"][0]["momentum_buffer"])
    assert torch.equal(torch.rand(3), expect[0]) and random.random() == expect[1]


def test_nothing_to_resume(tmp_path: Path) -> None:
    assert _mgr(tmp_path / "absent").load_latest() is None


def _save_two(root: Path) -> Path:
    mgr = _mgr(root)
    mgr.save(80, _state(80))
    return Path(mgr.save(120, _state(120)))


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "no-manifest"])
def test_bad_newest_falls_back_with_warning(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    newest = _save_two(tmp_path)
    f = newest / "rank-0.pt"
    data = bytearray(f.read_bytes())
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    else:
        (newest / "manifest.json").unlink()
    with pytest.warns(CheckpointWarning, match="step-000000120 is corrupt"):
        found = _mgr(tmp_path).load_latest()
    assert found is not None and found[0] == 80 and found[1]["step"] == 80
    err = capsys.readouterr().err
    assert "falling back to step-000000080" in err
    if damage == "bitflip":
        assert "checksum mismatch on rank-0.pt" in err


def test_leftover_tmp_dir_ignored_and_cleaned(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path)
    mgr.save(5, _state(5))
    crashed = tmp_path / ".tmp-step-10"  # a crash in the middle of writing step 10
    crashed.mkdir()
    (crashed / "rank-0.pt").write_bytes(b"half a checkp")
    found = _mgr(tmp_path).load_latest()
    assert found is not None and found[0] == 5
    mgr.save(10, _state(10))
    assert not crashed.exists() and not list(tmp_path.glob(".tmp-*"))
    found = _mgr(tmp_path).load_latest()
    assert found is not None and found[1]["step"] == 10


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.marker),))


def test_malicious_pickle_refused_never_executed(tmp_path: Path) -> None:
    newest = _save_two(tmp_path)
    marker = tmp_path / "pwned"
    f = newest / "rank-0.pt"
    torch.save({"model": _Evil(str(marker))}, f)
    manifest = (newest / "manifest.json").read_text()
    entry = {"sha256": sha256_file(f), "size": f.stat().st_size}  # a matching checksum
    import json

    m = json.loads(manifest)
    m["files"]["rank-0.pt"] = entry
    (newest / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointRefused, match="unsafe unpickling") as refused:
        _mgr(tmp_path).load_latest()
    assert not marker.exists()
    # the global it names and what to save instead, never torch's advice to load unsafely
    assert re.search(r"it would import and call '[\w.]+'; save only", str(refused.value))
    assert "weights_only" not in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).endswith("(model.state_dict(), optimizer.state_dict())")
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # cannot be talked into it
    try:
        with pytest.raises(CheckpointRefused):
            _mgr(tmp_path).load_latest()
    finally:
        del os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"]
    assert not marker.exists()


def test_keep_two(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        mgr.save(step, _state(step))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "LATEST",
        "step-000000003",
        "step-000000004",
    ]


def test_latest_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = _mgr(tmp_path, keep=2)
    mgr.save(0, _state(0))
    real_replace = os.replace
    replaced: list[str] = []

    def checked_replace(src: Any, dst: Any) -> None:
        assert (tmp_path / "LATEST").exists()
        assert Path(src).read_text().startswith("step-")  # complete before the swap
        replaced.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", checked_replace)
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append((tmp_path / "LATEST").read_text())  # raises if ever absent

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for step in range(1, 30):
            mgr.save(step, _state(step))
    finally:
        stop.set()
        watcher.join()
    assert replaced == ["LATEST"] * 29
    assert seen and all(s.startswith("step-") and len(s) == 14 for s in seen)


def test_due_every_steps(tmp_path: Path) -> None:
    mgr = _mgr(tmp_path, every_steps=5)
    assert [s for s in range(1, 21) if mgr.due(s)] == [5, 10, 15, 20]
    assert not _mgr(tmp_path).due(5)
    assert _mgr(tmp_path, every_seconds=0.0).due(1)


# ---------------------------------------------------------------- 2 real gloo ranks


def _train(ctx: Any, stop_after: int, total: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = ctx.prepare(model, opt)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    step = ctx.resume(model, opt)
    start = step
    if step < total:
        for xb, yb in ctx.shard(data, batch_size=4, epochs=3, seed=2):
            loss = torch.nn.functional.mse_loss(model(xb), yb) + torch.rand(()) * 0
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            ctx.checkpoint(step, model, opt, lr=0.05)
            if step in (stop_after, total):
                break
    return [torch.tensor(start), *(p.detach().clone() for p in model.parameters())]


def test_resume_equals_uninterrupted_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DMLCTL_CHECKPOINT_EVERY_STEPS", "5")
    monkeypatch.setenv("DMLCTL_CHECKPOINT_DIR", str(tmp_path / "a"))
    straight = run_ranks(_train, 2, args=(20, 20))
    monkeypatch.setenv("DMLCTL_CHECKPOINT_DIR", str(tmp_path / "b"))
    crashed = run_ranks(_train, 2, args=(12, 20))  # "crashes" after step 12
    assert [int(r[0]) for r in crashed] == [0, 0]
    resumed = run_ranks(_train, 2, args=(20, 20))
    assert [int(r[0]) for r in resumed] == [10, 10]
    for a, b in zip(straight, resumed, strict=True):
        for pa, pb in zip(a[1:], b[1:], strict=True):
            assert torch.equal(pa, pb)
    assert not any(
        torch.equal(pa, pb) for pa, pb in zip(crashed[0][1:], resumed[0][1:], strict=True)
    )


def _resume_step(ctx: Any, root: str) -> int:
    found = CheckpointManager(root, ctx.rank, ctx.world_size).load_latest()
    assert found is not None
    return found[0]


def test_ranks_agree_when_one_rank_newest_is_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DMLCTL_CHECKPOINT_EVERY_STEPS", "5")
    monkeypatch.setenv("DMLCTL_CHECKPOINT_DIR", str(tmp_path))
    run_ranks(_train, 2, args=(12, 20))
    f = tmp_path / "step-000000010" / "rank-1.pt"
    data = bytearray(f.read_bytes())
    data[-100] ^= 0x10
    f.write_bytes(bytes(data))
    assert run_ranks(_resume_step, 2, args=(str(tmp_path),)) == [5, 5]


# ------------------------------------------------- host-local and shared directories


def _save_as_hosts(ctx: Any, roots: list[str]) -> tuple[bool, str]:
    """Each rank plays the first rank of its own host (local rank 0), saving into
    ``roots[rank]`` (host-local directories) or one shared root."""
    mgr = CheckpointManager(roots[ctx.rank], ctx.rank, ctx.world_size, local_rank=0)
    path = mgr.save(5, _state(5 + ctx.rank))
    return mgr.committed_here, path


def test_host_local_directories_are_each_committed(tmp_path: Path) -> None:
    roots = [str(tmp_path / "a"), str(tmp_path / "b")]
    results = run_ranks(_save_as_hosts, 2, args=(roots,))
    assert [committed for committed, _ in results] == [True, True]  # one leader per dir
    manifests = []
    for rank, root in enumerate(roots):
        step = Path(root) / "step-000000005"
        assert (Path(root) / "LATEST").read_text() == step.name
        assert sorted(p.name for p in step.iterdir()) == ["manifest.json", f"rank-{rank}.pt"]
        manifests.append(json.loads((step / "manifest.json").read_text()))
    assert manifests[0]["files"] == manifests[1]["files"]  # every rank's file listed
    assert set(manifests[0]["files"]) == {"rank-0.pt", "rank-1.pt"}


def test_a_shared_directory_is_committed_once(tmp_path: Path) -> None:
    shared = str(tmp_path / "shared")
    results = run_ranks(_save_as_hosts, 2, args=([shared, shared],))
    assert sorted(committed for committed, _ in results) == [False, True]
    step = Path(shared) / "step-000000005"
    assert sorted(p.name for p in step.iterdir()) == ["manifest.json", "rank-0.pt", "rank-1.pt"]
    assert not list(Path(shared).glob(".tmp-*"))
    assert run_ranks(_resume_step, 2, args=(shared,)) == [5, 5]


def _load_in_bigger_world(ctx: Any, root: str) -> tuple[int, float]:
    with pytest.warns(CheckpointWarning, match="saved by 1 ranks"):
        found = CheckpointManager(root, ctx.rank, ctx.world_size).load_latest()
    assert found is not None
    return found[0], float(found[1]["w"][0])


def test_another_world_size_resumes_from_a_replica_with_a_warning(tmp_path: Path) -> None:
    _mgr(tmp_path).save(5, _state(5))  # saved by 1 rank, resumed by 2
    assert run_ranks(_load_in_bigger_world, 2, args=(str(tmp_path),)) == [(5, 5.0), (5, 5.0)]


# ------------------------------------------------------- fallbacks, a full disk (issue 12)


def test_unreadable_latest_falls_back_to_the_step_directories(tmp_path: Path) -> None:
    _save_two(tmp_path)
    (tmp_path / "LATEST").write_bytes(b"\xff\xfe\x00 not utf-8")
    found = _mgr(tmp_path).load_latest()
    assert found is not None and found[0] == 120


def _forge(step_dir: Path, data: bytes) -> None:
    """Replace rank 0's file by ``data`` and its manifest entry by a matching one."""
    f = step_dir / "rank-0.pt"
    f.write_bytes(data)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"]["rank-0.pt"] = {"sha256": sha256_file(f), "size": f.stat().st_size}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("data", [b"garbage" * 10, b"", b"PK\x03\x04" + b"x" * 50])
def test_a_file_that_matches_its_manifest_but_cannot_load_falls_back(
    tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    newest = _save_two(tmp_path)
    _forge(newest, data)
    with pytest.warns(CheckpointWarning, match="step-000000120 cannot be loaded") as seen:
        found = _mgr(tmp_path).load_latest()
    assert "weights_only" not in str(seen[0].message)  # no advice to load unsafely
    assert found is not None and found[0] == 80 and found[1]["step"] == 80
    assert "falling back to step-000000080" in capsys.readouterr().err


def test_every_checkpoint_corrupt_fails_unless_a_fresh_start_is_allowed(tmp_path: Path) -> None:
    newest = _save_two(tmp_path)
    _forge(newest, b"garbage")
    (tmp_path / "step-000000080" / "rank-0.pt").write_bytes(b"truncated")
    with pytest.warns(CheckpointWarning), pytest.raises(ckpt.CheckpointCorrupt) as info:
        _mgr(tmp_path).load_latest()
    assert "allow_fresh_start" in str(info.value) and "step-000000120" in str(info.value)
    with pytest.warns(CheckpointWarning, match="starting from step 0"):
        assert _mgr(tmp_path, allow_fresh_start=True).load_latest() is None


def test_a_new_run_never_resumes_another_runs_checkpoint_unless_warm_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _mgr(tmp_path, run_id="run-a").save(80, _state(80))
    manifest = json.loads((tmp_path / "step-000000080" / "manifest.json").read_text())
    assert manifest["run_id"] == "run-a"
    found = _mgr(tmp_path, run_id="run-a").load_latest()  # a restart of the same run
    assert found is not None and found[0] == 80
    with pytest.raises(CheckpointForeign) as info:
        _mgr(tmp_path, run_id="run-b").load_latest()
    message = str(info.value)
    assert "run run-a" in message and "step 80" in message and "warm_start" in message
    warm = _mgr(tmp_path, run_id="run-b", warm_start=True)
    found = warm.load_latest()
    assert found is not None and found[0] == 80 and torch.equal(found[1]["w"], _state(80)["w"])
    assert "warm start from run run-a's checkpoint step-000000080" in capsys.readouterr().err
    warm.save(90, _state(90))  # from then on the newest is this run's own
    assert _mgr(tmp_path, run_id="run-b").load_latest() is not None
    # a checkpoint that does not say who wrote it (an older dmlctl) is still resumed
    _mgr(tmp_path / "old").save(5, _state(5))
    assert _mgr(tmp_path / "old", run_id="run-c").load_latest() is not None


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs (skipped, saying why, where it cannot be mounted)."""
    with tmpfs(tmp_path / "tmpfs", "4m") as mount:
        yield mount


def test_a_full_disk_raises_disk_full_and_keeps_the_previous_checkpoint(
    small_tmpfs: Path,
) -> None:
    root = small_tmpfs / "ckpt"
    mgr = _mgr(root)
    mgr.save(5, {"w": torch.zeros(1000)})
    with pytest.raises(ckpt.DiskFull, match="no space left on the device writing checkpoint"):
        mgr.save(10, {"w": torch.zeros(2_000_000)})  # 8 MB on a 4 MiB file system
    assert not list(root.glob(".tmp-*"))
    found = _mgr(root).load_latest()
    assert found is not None and found[0] == 5


def _one_rank_cannot_write(ctx: Any, root: str) -> str:
    """Rank 1's part of step 10 cannot be pickled; every rank must fail the save the
    same way, after both have stopped writing."""
    mgr = CheckpointManager(root, ctx.rank, ctx.world_size)
    mgr.save(5, _state(5))
    state: dict[str, Any] = _state(10)
    if ctx.rank == 1:
        state["bad"] = lambda: None  # torch.save cannot pickle a lambda
    with pytest.raises(ckpt.CheckpointError) as raised:
        mgr.save(10, state)
    return str(raised.value)


def test_a_rank_that_cannot_write_fails_the_save_on_every_rank(tmp_path: Path) -> None:
    """The failing rank says why; the others name it; the temporary directory is
    removed once nobody writes into it, and step 5 stays the newest checkpoint."""
    mine, theirs = reversed(run_ranks(_one_rank_cannot_write, 2, args=(str(tmp_path),)))
    assert mine.startswith("could not write checkpoint step 10") and "lambda" in mine, mine
    assert theirs.startswith("rank 1: could not write checkpoint step 10"), theirs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step-000000005"]
    assert run_ranks(_resume_step, 2, args=(str(tmp_path),)) == [5, 5]


def test_a_manager_that_does_not_write_is_never_due_and_still_loads(tmp_path: Path) -> None:
    """restart.mode: in_place: one worker saves, the others (``writes=False``) never
    save and resume from its file."""
    writer, reader = _mgr(tmp_path, every_steps=1), _mgr(tmp_path, every_steps=1, writes=False)
    assert writer.due(1) and not reader.due(1) and not reader.due(2)
    writer.save(1, {"w": torch.ones(2)})
    found = reader.load_latest()
    assert found is not None and found[0] == 1 and torch.equal(found[1]["w"], torch.ones(2))
