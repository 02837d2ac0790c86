"""Checkpoint faults end to end: the real CLI, host agent, torchrun and gloo ranks.

The job (``jobs/ckptfault/train.py``) trains 20 steps with a checkpoint every 5 and, on
its first attempt only, injects the fault itself (see its docstring): dmlctl carries no
test hook. Each faulty run is compared with one fault-free run of the same script.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import Cli
from tests.integration.procs import run_processes

JOBS = Path(__file__).parent / "jobs"
pytestmark = pytest.mark.integration


def _job(tmp_path: Path, name: str, fault: str, rank: int = 1) -> Path:
    job = tmp_path / f"{name}.yaml"
    job.write_text(
        f"name: {name}\nscript: train.py\nworkdir: {JOBS / 'ckptfault'}\nworkers: 2\n"
        f"env:\n  FAULT: {fault}\n  FAULT_RANK: '{rank}'\n"
        f"  OUT: {tmp_path / (name + '.pt')}\n  MARKER: {tmp_path / 'pwned'}\n"
        "restart:\n  max_infra_restarts: 1\n  backoff_initial: 0.2\n"
        "checkpoint:\n  every_steps: 5\n  keep: 2\n"
    )
    return job


def _launch(cli: Cli, job: Path) -> tuple[str, str, dict[str, Any]]:
    """Runs ``job`` in the foreground; (run id, everything printed, state.json)."""
    before = {p.name for p in cli.runs()}
    proc = cli.run("launch", str(job), "--ui", "plain", timeout=90)
    (run_id,) = {p.name for p in cli.runs()} - before
    out = proc.stdout + proc.stderr
    state = cli.state(run_id)
    assert state["exit_code"] == proc.returncode, out
    assert not run_processes(run_id), f"left behind: {run_processes(run_id)}\n{out}"
    return run_id, out, state


def _checkpoint_dir(cli: Cli, run_id: str) -> Path:
    """The checkpoint directory the plan gave the ranks (DMLCTL_CHECKPOINT_DIR)."""
    plan = json.loads((cli.home / "runs" / run_id / "plan.json").read_text())
    (directory,) = {h["env"]["DMLCTL_CHECKPOINT_DIR"] for h in plan["hosts"]}
    return Path(directory)


def _starts(out: str, attempt: int) -> dict[int, int]:
    """{rank: step} from the ``rank R attempt A starts at step S`` lines."""
    found = re.findall(rf"rank (\d+) attempt {attempt} starts at step (\d+)", out)
    return {int(r): int(s) for r, s in found}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, torch.Tensor]]:
    """Final weights of a fault-free run of the same script (one run per module)."""
    tmp = tmp_path_factory.mktemp("reference")
    cli = Cli(tmp / "home")
    _, out, state = _launch(cli, _job(tmp, "clean", "none"))
    assert (state["phase"], state["exit_code"], state["restarts"]) == ("succeeded", 0, 0), out
    assert _starts(out, 1) == {0: 0, 1: 0}, out
    yield _weights(tmp / "clean.pt")


def _assert_recovered(
    cli: Cli,
    tmp_path: Path,
    name: str,
    killed: int,
    run_id: str,
    out: str,
    state: dict[str, Any],
    reference: dict[str, torch.Tensor],
) -> None:
    """One infra restart after rank ``killed``'s SIGKILL, resumed by every rank from
    step 5, a clean checkpoint directory at the end and the weights of the fault-free run."""
    assert (state["phase"], state["exit_code"], state["restarts"]) == ("succeeded", 0, 1), out
    failures = [(f["rank"], f["exc_type"], f["message"]) for f in state["failures"]]
    assert failures == [(killed, "Signal", "killed by SIGKILL")], f"{failures}\n{out}"
    assert _starts(out, 1) == {0: 0, 1: 0}, out
    assert _starts(out, 2) == {0: 5, 1: 5}, out  # the previous checkpoint: not 10, not 0
    root = _checkpoint_dir(cli, run_id)
    assert f"checkpoint dir: {root}" in out  # what the ranks were given
    names = sorted(p.name for p in root.iterdir())
    assert not [n for n in names if n.startswith(".tmp-")], names
    assert names == ["LATEST", "step-000000015", "step-000000020"], names  # keep: 2
    assert (root / "LATEST").read_text().strip() == "step-000000020"
    got = _weights(tmp_path / f"{name}.pt")
    assert got.keys() == reference.keys()
    for key in reference:
        assert torch.equal(got[key], reference[key]), key


@pytest.mark.parametrize(
    ("fault", "rank", "struck"),
    [
        ("write", 1, r"ckptfault: rank 1 wrote \d+ of \d+ bytes of rank-1\.pt at step 10"),
        (
            "precommit",
            0,
            r"ckptfault: rank 0 before committing \.tmp-step-10 holding "
            r"\['manifest\.json', 'rank-0\.pt', 'rank-1\.pt'\]",
        ),
        (
            "prelatest",
            0,
            r"ckptfault: rank 0 before replacing LATEST \(committed "
            r"step-000000010: True\)",
        ),
    ],
    ids=["mid-write-rank1", "before-commit-rank0", "before-latest-rank0"],
)
def test_kill_9_during_a_checkpoint_write_resumes_from_the_previous_one(
    cli: Cli,
    tmp_path: Path,
    reference: dict[str, torch.Tensor],
    fault: str,
    rank: int,
    struck: str,
) -> None:
    run_id, out, state = _launch(cli, _job(tmp_path, fault, fault, rank))
    assert re.search(struck, out), out  # the fault happened where it was meant to
    _assert_recovered(cli, tmp_path, fault, rank, run_id, out, state, reference)


@pytest.mark.parametrize(
    ("fault", "rank", "reason"),
    [
        ("truncate", 1, r"size mismatch on rank-1\.pt \(truncated/missing: \d+ bytes\)"),
        ("bitflip", 0, r"checksum mismatch on rank-0\.pt"),
    ],
    ids=["truncated-rank1", "bit-flipped-rank0"],
)
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
    cli: Cli,
    tmp_path: Path,
    reference: dict[str, torch.Tensor],
    fault: str,
    rank: int,
    reason: str,
) -> None:
    run_id, out, state = _launch(cli, _job(tmp_path, fault, fault, rank))
    assert f"ckptfault: rank {rank} {fault} step-000000010/rank-{rank}.pt" in out, out
    assert f"ckptfault: rank {rank} at step 12; SIGKILL" in out, out
    warning = (
        rf"dmlctl rank {rank}: checkpoint step-000000010 is corrupt \({reason}\); "
        r"falling back to step-000000005"
    )
    assert re.search(warning, out), out
    log = (cli.home / "runs" / run_id / "logs" / f"rank-{rank}.log").read_text()
    assert re.search(warning, log), log  # kept in the rank's own log, too
    _assert_recovered(cli, tmp_path, fault, rank, run_id, out, state, reference)


def test_checkpoint_needing_unsafe_unpickling_is_refused_never_executed(
    cli: Cli, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    run_id, out, state = _launch(cli, _job(tmp_path, "pickle", "pickle", 1))
    assert "ckptfault: rank 1 pickle step-000000010/rank-1.pt" in out, out
    assert not marker.exists(), "the malicious pickle was executed"
    assert (state["phase"], state["exit_code"]) == ("failed", 1), out
    assert state["restarts"] == 1  # the SIGKILL of attempt 1; the refusal is not retried
    assert _starts(out, 2) == {}, out  # no rank got past resume()
    # Every rank refuses; the root cause is either rank's ("…/step-000000010/rank-1.pt
    # needs unsafe unpickling (refused): …" or "another rank refused step-000000010").
    cause = state["root_cause"]
    assert cause["exc_type"] == "CheckpointRefused", cause
    assert "refused" in cause["message"] and "step-000000010" in cause["message"], cause
    assert "weights_only" not in cause["message"], cause  # never advice to load unsafely
    assert "step-000000010/rank-1.pt needs unsafe unpickling (refused)" in out, out
    assert not (tmp_path / "pickle.pt").exists()
    # The payload is live: unpickled without weights_only it does create the marker.
    evil = _checkpoint_dir(cli, run_id) / "step-000000010" / "rank-1.pt"
    torch.load(evil, weights_only=False)
    assert marker.exists()
