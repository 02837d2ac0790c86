"""A failed rank records its exception before its ``atexit`` handlers close its process
group: once they have, its peers fail at once and torchrun may stop it, and a record
written later is lost (the run was then blamed on a peer's collateral error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dmlctl import protocol

SCRIPT = """\
import atexit, json, os, sys
events = os.path.join(os.environ["DMLCTL_RANK_DIR"], "rank-0.events.jsonl")
def seen():
    with open(events) as f:
        kinds = [json.loads(line)["kind"] for line in f]
    print("exit recorded before atexit:", "exit" in kinds, flush=True)
atexit.register(seen)
if sys.argv[1] == "fail":
    raise ValueError("bad batch")
"""


def run_rank(tmp_path: Path, how: str) -> tuple[str, list[dict[str, object]]]:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, protocol.ENV_RANK_DIR: str(tmp_path), "RANK": "0"}
    argv = [sys.executable, "-m", "dmlctl.runtime.entry", str(tmp_path / "train.py"), how]
    subprocess.run(argv, env=env, timeout=60, check=False)
    out = (tmp_path / "rank-0.stdout").read_text()
    records = [json.loads(line) for line in (tmp_path / "rank-0.events.jsonl").open()]
    return out, [r for r in records if r["kind"] == protocol.KIND_EXIT]


@pytest.mark.parametrize(("how", "before", "code"), [("fail", True, 1), ("ok", False, 0)])
def test_a_failed_rank_records_its_error_before_atexit_and_a_finished_one_after(
    tmp_path: Path, how: str, before: bool, code: int
) -> None:
    out, (record,) = run_rank(tmp_path, how)
    assert f"exit recorded before atexit: {before}" in out
    assert record["code"] == code
    if how == "fail":
        assert record["error"]["type"] == "ValueError"  # type: ignore[index]


FULL = """\
import errno, sys
if sys.argv[1] == "print":  # as a print into a full rank file fails: no file named
    raise OSError(errno.ENOSPC, "No space left on device")
raise OSError(errno.ENOSPC, "No space left on device", "/data/out.bin")
"""


@pytest.mark.parametrize("how", ["print", "named"])
def test_a_full_disk_says_where(tmp_path: Path, how: str) -> None:
    """DiskFull names the file, or, where the error names none, the room left where the
    rank's output goes."""
    (tmp_path / "train.py").write_text(FULL)
    env = {**os.environ, protocol.ENV_RANK_DIR: str(tmp_path), "RANK": "0"}
    argv = [sys.executable, "-m", "dmlctl.runtime.entry", str(tmp_path / "train.py"), how]
    subprocess.run(argv, env=env, timeout=60, check=False)
    records = [json.loads(line) for line in (tmp_path / "rank-0.events.jsonl").open()]
    (error,) = [r["error"] for r in records if r["kind"] == protocol.KIND_EXIT]
    assert error["type"] == "DiskFull"
    if how == "named":
        assert "'/data/out.bin'" in error["message"], error
    else:
        said = f"(no file named; this rank's output goes to {tmp_path}: "
        assert said in error["message"] and "bytes free there)" in error["message"], error
