"""Code sync with the real receiver scripts, through LocalTransport."""

from __future__ import annotations

import io
import os
import sys
import tarfile
from pathlib import Path

from dmlctl.provision.sync import (
    RECEIVER,
    SyncTarget,
    changed,
    excludes_for,
    local_files,
    make_tar,
    sync_all,
    sync_host,
)
from dmlctl.transport.fake import ScriptedTransport
from dmlctl.transport.local import LocalTransport


def project(root: Path) -> Path:
    files = {
        "train.py": "print('train')\n",
        "lib/util.py": "X = 1\n",
        "data/big.bin": "x" * 100,
        "notes.tmp": "scratch\n",
        ".git/HEAD": "ref: refs/heads/main\n",
        "__pycache__/train.cpython-311.pyc": "bytecode",
        "lib/__pycache__/util.cpython-311.pyc": "bytecode",
        ".gitignore": "data/\n*.tmp\n",
        "run.sh": "#!/bin/sh\necho hi\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "run.sh").chmod(0o755)
    return root


def test_excludes_builtin_gitignore_and_job_patterns(tmp_path: Path) -> None:
    root = project(tmp_path / "src")
    files = local_files(root, excludes_for(root, ["run.sh"]))
    assert sorted(files) == [".gitignore", "lib/util.py", "train.py"]
    files = local_files(root, excludes_for(root, []))
    assert "run.sh" in files and "data/big.bin" not in files and "notes.tmp" not in files


def test_changed_compares_size_and_mtime(tmp_path: Path) -> None:
    root = project(tmp_path / "src")
    files = local_files(root, excludes_for(root, []))
    same = {rel: [f.size, f.mtime_ns] for rel, f in files.items()}
    assert changed(files, same) == []
    same["train.py"] = [same["train.py"][0] + 1, same["train.py"][1]]
    del same["run.sh"]
    assert sorted(changed(files, same)) == ["run.sh", "train.py"]


def test_sync_is_incremental_and_keeps_modes_and_times(tmp_path: Path) -> None:
    root = project(tmp_path / "src")
    dest = tmp_path / "host" / "job"
    t = LocalTransport("h")
    files = local_files(root, excludes_for(root, []))
    first = sync_host(t, sys.executable, files, str(dest))
    assert first.ok and first.files_sent == len(files) == 4
    assert (dest / "lib" / "util.py").read_text() == "X = 1\n"
    assert os.access(dest / "run.sh", os.X_OK)
    assert (dest / "train.py").stat().st_mtime_ns // 10**9 == files["train.py"].mtime_ns // 10**9
    second = sync_host(t, sys.executable, files, str(dest))
    assert (second.files_sent, second.bytes_sent) == (0, 0)
    (root / "train.py").write_text("print('changed')\n")
    os.utime(root / "train.py", ns=(1, 2_000_000_000))
    third = sync_host(t, sys.executable, local_files(root, excludes_for(root, [])), str(dest))
    assert third.files_sent == 1
    assert (dest / "train.py").read_text() == "print('changed')\n"
    (dest / "checkpoint.pt").write_text("kept")  # files on the host are never deleted
    sync_host(t, sys.executable, files, str(dest))
    assert (dest / "checkpoint.pt").read_text() == "kept"


def test_receiver_refuses_paths_that_leave_the_directory(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"owned"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    dest = tmp_path / "dest"
    res = LocalTransport("h").run(
        [sys.executable, "-c", RECEIVER, str(dest)], timeout=30, input=buf.getvalue()
    )
    assert res.exit_code != 0 and "refusing tar member '../escaped.txt'" in res.stderr
    assert not (tmp_path / "escaped.txt").exists()


def test_every_host_is_reported_even_when_one_fails(tmp_path: Path) -> None:
    root = project(tmp_path / "src")
    files = local_files(root, excludes_for(root, []))
    bad = ScriptedTransport("down")  # every command unscripted: exit 127
    good = LocalTransport("up")
    results = sync_all(
        files,
        [
            SyncTarget(bad, "python3", "/nowhere"),
            SyncTarget(good, sys.executable, str(tmp_path / "up")),
        ],
    )
    assert [r.host for r in results] == ["down", "up"]
    assert not results[0].ok and "not scripted" in (results[0].error or "")
    assert results[1].ok and results[1].files_sent == len(files)


def test_make_tar_is_a_plain_tar_of_the_given_paths(tmp_path: Path) -> None:
    root = project(tmp_path / "src")
    files = local_files(root, excludes_for(root, []))
    with tarfile.open(fileobj=io.BytesIO(make_tar(files, ["train.py"]))) as tar:
        assert tar.getnames() == ["train.py"]
