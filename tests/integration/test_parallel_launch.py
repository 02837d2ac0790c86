"""Model parallelism through the real CLI: ``dmlctl launch`` of laid-out jobs
(torchrun, gloo, 4 ranks), the mesh in the run's state and ``status``, a failed rank
restarted from the sharded checkpoint with the uninterrupted run's losses, and a
batch that does not split into the pipeline's microbatches named as the root cause."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.integration.procs import run_processes

JOB = Path(__file__).parent / "jobs" / "parallel"
pytestmark = pytest.mark.integration


def _job(tmp_path: Path, name: str, *lines: str) -> Path:
    job = tmp_path / f"{name}.yaml"
    body = [f"name: {name}", f"workdir: {JOB}", "script: train.py", "workers: 4", *lines]
    job.write_text("\n".join(body) + "\n")
    return job


def _losses(out: str) -> list[float]:
    found = re.findall(r"losses ([0-9. ]+)", out)
    assert found, out
    return [float(v) for v in found[-1].split()]


def test_a_failed_rank_restarts_from_the_sharded_checkpoint(cli: Cli, tmp_path: Path) -> None:
    """tensor 2 × data 2; rank 1 fails after step 6 on the first attempt; the restart
    resumes from step 4's checkpoint and the run's losses equal an uninterrupted run's."""
    mesh = ["parallelism:", "  tensor_parallel_degree: 2"]
    plain = cli.run("launch", str(_job(tmp_path, "plain", *mesh)), "--ui", "plain", timeout=300)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    flaky = _job(
        tmp_path,
        "flaky",
        "args: ['--fail-at', '6']",
        *mesh,
        "checkpoint:",
        "  every_steps: 4",
        "restart:",
        "  max_user_restarts: 1",
        "  backoff_initial: 0.2",
    )
    proc = cli.run("launch", str(flaky), "--ui", "plain", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = next(r for r in cli.runs() if r.name.startswith("flaky"))
    state = cli.state(run.name)
    assert state["restarts"] == 1 and state["mesh"]["tp"] == 2, state
    logs = "".join(p.read_text() for p in sorted((run / "logs").glob("rank-*.log")))
    assert logs.count("starts at step 4") == 4, logs  # every rank resumed at step 4
    resumed = _losses((run / "logs" / "rank-0.log").read_text())  # steps 5-12, attempt 2
    first = next(r for r in cli.runs() if r.name.startswith("plain"))
    uninterrupted = _losses((first / "logs" / "rank-0.log").read_text())
    assert len(resumed) == 8 and len(uninterrupted) == 12, (resumed, uninterrupted)
    gaps = [abs(a - b) for a, b in zip(resumed, uninterrupted[4:], strict=True)]
    assert max(gaps) < 1e-4, (resumed, uninterrupted)
    status = cli.run("status", run.name)
    assert "device mesh: dp_replicate 2 × tp 2 (4 workers)" in status.stdout, status.stdout
    assert run_processes(run.name) == []


def test_a_batch_that_does_not_split_into_microbatches_is_the_root_cause(
    cli: Cli, tmp_path: Path
) -> None:
    job = _job(
        tmp_path,
        "micro",
        "parallelism:",
        "  pipeline_parallel_degree: 2",
        "  pipeline_parallel_microbatches: 3",
        "restart:",
        "  max_user_restarts: 0",
    )
    proc = cli.run("launch", str(job), "--ui", "plain", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (run,) = cli.runs()
    cause = cli.state(run.name)["root_cause"]
    assert cause["exc_type"] == "ValueError", cause
    assert "does not split into 3 microbatches" in cause["message"], cause
    assert run_processes(run.name) == []
