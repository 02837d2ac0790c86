"""A checkpoint directory belongs to one run at a time (:mod:`dmlctl.checkpoint_claim`):
the lock decides, the holder's death frees it, the host agent refuses another run's."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dmlctl import checkpoint_claim
from dmlctl.agent.messages import Emitter
from dmlctl.agent.start import prepare
from dmlctl.agent_config import AgentConfig
from dmlctl.checkpoint_claim import CLAIM_FILE, CheckpointInUse, claim, release, where
from dmlctl.plan.model import TorchrunCommand
from dmlctl.protocol import ENV_CHECKPOINT_CLAIM, ENV_CHECKPOINT_DIR


def test_a_claimed_directory_refuses_another_run_and_names_the_holder(tmp_path: Path) -> None:
    directory = str(tmp_path / "ckpt")
    held = claim(directory, "run-a")
    try:
        assert held is not None
        assert (tmp_path / "ckpt" / CLAIM_FILE).read_text() == "run-a"
        with pytest.raises(CheckpointInUse) as info:
            claim(directory, "run-b")
        assert info.value.owner == "run-a"
        assert f"checkpoint.dir {directory} is in use by run run-a" in str(info.value)
        assert info.value.exit_code == 2
        assert claim(directory, "run-a") is None  # the same run: already its own
    finally:
        release(held)
    taken = claim(directory, "run-b")  # released: the next run takes it
    assert taken is not None and (tmp_path / "ckpt" / CLAIM_FILE).read_text() == "run-b"
    release(taken)


def test_the_kernel_frees_the_claim_of_a_run_that_died(tmp_path: Path) -> None:
    directory = str(tmp_path / "ckpt")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dmlctl.checkpoint_claim import claim;"
            f"claim({directory!r}, 'dead-run'); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(CheckpointInUse):
        claim(directory, "run-b")
    holder.kill()
    holder.wait()
    fd = claim(directory, "run-b")  # no stale claim: nothing to clean up by hand
    assert fd is not None
    release(fd)


def test_two_claims_at_once_give_the_directory_to_exactly_one(tmp_path: Path) -> None:
    directory = str(tmp_path / "ckpt")
    outcomes: dict[str, object] = {}
    go = threading.Barrier(2)

    def attempt(run_id: str) -> None:
        go.wait()
        try:
            outcomes[run_id] = claim(directory, run_id)
        except CheckpointInUse as e:
            outcomes[run_id] = e

    threads = [threading.Thread(target=attempt, args=(r,)) for r in ("r1", "r2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r, o in outcomes.items() if isinstance(o, int)]
    lost = [o for o in outcomes.values() if isinstance(o, CheckpointInUse)]
    assert len(won) == 1 and len(lost) == 1 and lost[0].owner == won[0]
    release(outcomes[won[0]])  # type: ignore[arg-type]


def test_a_relative_directory_is_the_ranks_one_under_the_workdir(tmp_path: Path) -> None:
    assert where("ckpt", str(tmp_path)) == str(tmp_path / "ckpt")
    assert where("/abs/ckpt", str(tmp_path)) == "/abs/ckpt"


def test_the_host_agent_will_not_start_a_run_on_another_runs_directory(tmp_path: Path) -> None:
    directory = str(tmp_path / "ckpt")
    held = claim(directory, "other-run")
    torchrun = TorchrunCommand("/py", 1, 2, "h:1", "mine.1", "t.py", (), False, "h")
    env = {ENV_CHECKPOINT_DIR: directory, ENV_CHECKPOINT_CLAIM: "1"}
    config = AgentConfig("mine", "a", 0, str(tmp_path), str(tmp_path / "ranks"), torchrun, env)
    out = io.StringIO()
    try:
        assert prepare(config, Emitter(out, threading.Event())) is None
    finally:
        release(held)
    assert "is in use by run other-run" in out.getvalue()
    assert '"SpecInvalid"' in out.getvalue()
    mine = checkpoint_claim.claim(directory, "mine")  # free again
    assert mine is not None
    release(mine)
