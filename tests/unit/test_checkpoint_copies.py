"""The controller's checkpoint copies (``dmlctl.provision.replicate``) with real files
and real commands through the local transport: two "hosts" are two directories."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from dmlctl import protocol
from dmlctl.agent_config import TorchrunCommand
from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.provision.replicate import Replicator, replicated
from dmlctl.spec.restart import CheckpointSpec
from dmlctl.strategies import registry
from dmlctl.transport.local import LocalTransport


def host(name: str, root: Path, *, local: bool = False) -> HostPlan:
    return HostPlan(
        name=name,
        address=name,
        is_local=local,
        port=22,
        user=None,
        identity_file=None,
        node_rank=0,
        nproc=1,
        first_rank=0,
        python=sys.executable,
        workdir=str(root),
        rank_dir=str(root / name),
        agent_argv=(),
        agent_cwd=None,
        torchrun=TorchrunCommand(sys.executable, 1, 1, "localhost:1", "run", "t.py"),
        env={protocol.ENV_CHECKPOINT_DIR: str(root / "ckpt")},
    )


def commit_part(root: Path, step: int, mine: dict[str, bytes], every: dict[str, bytes]) -> None:
    """What a host's leader leaves: its own ranks' files, a manifest listing all."""
    d = root / "ckpt" / protocol.checkpoint_step_dir(step)
    d.mkdir(parents=True)
    for name, data in mine.items():
        (d / name).write_bytes(data)
    files = {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in every.items()}
    manifest = {"format": 1, "step": step, "world_size": len(every), "files": files}
    (d / protocol.CHECKPOINT_MANIFEST).write_text(json.dumps(manifest))
    (root / "ckpt" / protocol.CHECKPOINT_LATEST).write_text(d.name)


def setup(tmp_path: Path, keep: int = 2) -> tuple[Replicator, list[HostPlan], list[int]]:
    hosts = [host("a", tmp_path / "a"), host("b", tmp_path / "b")]
    transports = {h.name: LocalTransport(h.name) for h in hosts}
    copied: list[int] = []
    rep = Replicator(tmp_path / "controller", transports, hosts, keep=keep, on_copied=copied.append)
    return rep, hosts, copied


def save_everywhere(tmp_path: Path, rep: Replicator, step: int) -> dict[str, bytes]:
    every = {"rank-0.pt": f"zero {step}".encode(), "rank-1.pt": f"one {step}".encode()}
    commit_part(tmp_path / "a", step, {"rank-0.pt": every["rank-0.pt"]}, every)
    commit_part(tmp_path / "b", step, {"rank-1.pt": every["rank-1.pt"]}, every)
    rep.saved("a", step)
    rep.saved("b", step)
    rep.drain(30)
    return every


def test_the_hosts_parts_make_one_complete_copy(tmp_path: Path) -> None:
    rep, _, copied = setup(tmp_path)
    save_everywhere(tmp_path, rep, 5)
    step = tmp_path / "controller" / "step-000000005"
    assert sorted(p.name for p in step.iterdir()) == ["manifest.json", "rank-0.pt", "rank-1.pt"]
    assert (tmp_path / "controller" / "LATEST").read_text() == step.name
    assert copied == [5] and rep.problems == []


def test_a_part_alone_is_not_committed(tmp_path: Path) -> None:
    rep, _, copied = setup(tmp_path)
    every = {"rank-0.pt": b"x", "rank-1.pt": b"y"}
    commit_part(tmp_path / "a", 5, {"rank-0.pt": b"x"}, every)
    rep.saved("a", 5)
    rep.drain(30)
    assert copied == [] and rep.newest() is None
    assert not (tmp_path / "controller" / "LATEST").exists()


def test_only_the_newest_copies_are_kept(tmp_path: Path) -> None:
    rep, _, copied = setup(tmp_path, keep=2)
    for step in (5, 10, 15):
        save_everywhere(tmp_path, rep, step)
    names = sorted(p.name for p in (tmp_path / "controller").iterdir() if p.is_dir())
    assert names == ["step-000000010", "step-000000015"]
    assert copied == [5, 10, 15]


def test_hand_out_gives_a_host_the_files_it_lacks(tmp_path: Path) -> None:
    rep, hosts, _ = setup(tmp_path)
    every = save_everywhere(tmp_path, rep, 5)
    fresh = host("c", tmp_path / "c")
    rep.transports = {**rep.transports, "c": LocalTransport("c")}
    assert rep.hand_out([*hosts, fresh]) == []
    for name in ("a", "b", "c"):
        d = tmp_path / name / "ckpt" / "step-000000005"
        assert {p.name: p.read_bytes() for p in d.iterdir() if p.name != "manifest.json"} == every
        assert (tmp_path / name / "ckpt" / "LATEST").read_text() == d.name


def test_hand_out_never_moves_latest_back(tmp_path: Path) -> None:
    rep, hosts, _ = setup(tmp_path)
    save_everywhere(tmp_path, rep, 5)
    (tmp_path / "a" / "ckpt" / "LATEST").write_text("step-000000010")  # a is further on
    assert rep.hand_out(hosts[:1]) == []
    assert (tmp_path / "a" / "ckpt" / "LATEST").read_text() == "step-000000010"
    assert (tmp_path / "a" / "ckpt" / "step-000000005" / "rank-1.pt").is_file()


def test_only_runs_with_remote_hosts_and_own_directories_are_copied(tmp_path: Path) -> None:
    remote, local = host("a", tmp_path), host("l", tmp_path, local=True)

    def plan(hosts: tuple[HostPlan, ...], checkpoint: dict[str, object]) -> LaunchPlan:
        spec = CheckpointSpec.model_validate(checkpoint) if checkpoint else None
        params = registry.load("ssgd").Params()
        return LaunchPlan(
            "r", "j", "ssgd", params, "t.py", (), 1, "x:1", hosts, (), checkpoint=spec
        )

    assert replicated(plan((remote,), {"keep": 3}))
    assert not replicated(plan((local,), {"keep": 3}))
    assert not replicated(plan((remote,), {}))
    assert not replicated(plan((remote,), {"keep": 3, "dir": "/shared/{run_id}"}))
