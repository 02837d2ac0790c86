"""Every job of ``examples/strategies`` and ``examples/parameter-server`` trains: its
script (unchanged) runs as ``__main__`` on warm gloo ranks with the strategy, parameters
and roles the job file gives, as validated by ``dmlctl``'s own loader.

* ``examples/strategies`` (the quickstart's ``train.py``): above 0.8 test accuracy, with
  the strategy's communication counted in its metrics;
* ``examples/parameter-server``: within 0.04 test loss and 0.02 accuracy of the
  single-process run of the same script (same epochs, same per-worker batch; about
  0.11 and 0.96), except adadelay (:data:`NOISY`), every server reporting its traffic.

``tests/integration/test_launch.py`` and ``test_parameter_servers.py`` plan each example
with ``launch --dry-run`` and launch one of each family through the real CLI; this file
is what checks that each one learns.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

from dmlctl.spec.loader import load_job
from tests.conftest import REPO
from tests.strategies.harness import run_ranks

pytestmark = pytest.mark.integration

EXAMPLES = sorted((REPO / "examples" / "strategies").glob("*.yaml"))


def _run_script(ctx: Any, script: str, args: list[str]) -> str:
    """Run ``script`` as ``python script ARGS`` would (its ``dmlctl.init()`` returns
    this rank's context); what it printed."""
    out = io.StringIO()
    argv, path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    return out.getvalue()


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_strategy_example_trains(example: Path, tmp_path: Path) -> None:
    job = load_job(example)
    assert isinstance(job.workers, int)
    printed = run_ranks(
        _run_script,
        job.workers,
        strategy=job.strategy.name,
        params=job.strategy.params.model_dump(mode="json", exclude_unset=True),
        args=(str(Path(job.workdir) / job.script), list(job.args)),
        env={"DMLCTL_RANK_DIR": str(tmp_path)},
        timeout=300,
    )
    accuracy = float(printed[0].split("final accuracy: ")[1].split()[0])
    assert accuracy > 0.8, (example.name, accuracy)
    values = _metric_values(tmp_path)
    assert any("comm_bytes_per_step" in v for v in values), (example.name, values[:3])


def _metric_values(rank_dir: Path) -> list[dict[str, Any]]:
    """The values of every metric record the ranks wrote into ``rank_dir``."""
    records = [
        json.loads(line)
        for path in sorted(rank_dir.glob("rank-*.events.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return [r["values"] for r in records if r.get("kind") == "metric"]


# ---------------------------------------------------------------- parameter servers

PS_DIR = REPO / "examples" / "parameter-server"
PS_CASES = {
    "asgd-2w-1s": "asgd.yaml",
    "asgd-overlap-2w-1s": "asgd-overlap.yaml",
    "ssp-2w-1s": "ssp.yaml",
    "adadelay-2w-1s": "adadelay.yaml",
    "easgd-async-2w-2s": "easgd-async.yaml",
    "sync-ps-3w-1s": "sync-ps.yaml",
    "aadmm-2w-1s": "aadmm.yaml",
    "asgd-3w-2s": (
        "workers: 3\nparameter_servers: 2\nstrategy:\n  name: asgd\n  params: {n_fetch: 2}\n"
    ),
}
"""Every job of ``examples/parameter-server`` (and asgd with 3 workers and 2 servers):
the file's name, or the body of a job file that runs the example's ``train.py``."""
LOSS_TOLERANCE = 0.04
ACC_TOLERANCE = 0.02
NOISY = {"adadelay-2w-1s": (0.10, 0.04), "sync-ps-3w-1s": (0.06, 0.02)}
"""Wider (loss, accuracy) tolerances: adadelay's servers take a plain SGD step (no
momentum; 1/L ≈ 0.16 here, barely shrinking with c = 0.1), so where its final iterate
lands varies with the arrival order: 0.118–0.174 test loss over 39 runs of this test
(7 of the 23 with c = 0.1 above 0.15; c of 1 or 3 kept the tail), and 0.181 and 0.191
(accuracy 0.931) in suite runs on a loaded machine (baseline 0.111, 0.96). sync-ps
with a backup worker drops the last gradient of every round: on a loaded machine one
worker is last more often and its shard counts for less — 0.151 in a suite run
(baseline 0.111; 0.124 idle, docs/strategies.md)."""


def _final_line(printed: str) -> dict[str, float]:
    """``final test loss L accuracy A`` (what the example's rank 0 prints last)."""
    line = next(x for x in printed.splitlines() if x.startswith("final test loss"))
    parts = line.split()
    return {"test_loss": float(parts[3]), "test_acc": float(parts[5])}


@pytest.fixture(scope="module")
def ps_baseline() -> dict[str, float]:
    """The single-process run of the example: ``python train.py``, one rank, no strategy."""
    (printed,) = run_ranks(
        _run_script, 1, strategy="none", args=(str(PS_DIR / "train.py"), []), timeout=300
    )
    return _final_line(printed)


def _ps_job(tmp_path: Path, case: str) -> Path:
    source = PS_CASES[case]
    if source.endswith(".yaml"):
        return PS_DIR / source
    job = tmp_path / f"{case}.yaml"
    job.write_text(f"name: {case}\nworkdir: {PS_DIR}\nscript: train.py\n{source}")
    return job


@pytest.mark.parametrize("case", list(PS_CASES))
def test_every_parameter_server_example_reaches_the_single_process_loss(
    case: str, tmp_path: Path, ps_baseline: dict[str, float]
) -> None:
    """Workers and servers with the roles the plan gives them (servers last on the
    host); the workers' final model within the tolerance of one process, and every
    server reports its traffic and the staleness of what it applied."""
    job = load_job(_ps_job(tmp_path, case))
    assert isinstance(job.workers, int)
    servers = job.parameter_servers
    printed = run_ranks(
        _run_script,
        job.workers + servers,
        strategy=job.strategy.name,
        params=job.strategy.params.model_dump(mode="json", exclude_unset=True),
        roles=["worker"] * job.workers + ["server"] * servers,
        args=(str(Path(job.workdir) / job.script), list(job.args)),
        env={"DMLCTL_RANK_DIR": str(tmp_path)},
        timeout=300,
    )
    assert printed[job.workers :] == [None] * servers  # a server never runs the script
    final = _final_line(printed[0])
    loss_tolerance, acc_tolerance = NOISY.get(case, (LOSS_TOLERANCE, ACC_TOLERANCE))
    assert final["test_loss"] <= ps_baseline["test_loss"] + loss_tolerance, (final, ps_baseline)
    assert final["test_acc"] >= ps_baseline["test_acc"] - acc_tolerance, (final, ps_baseline)
    values = _metric_values(tmp_path)
    server_records = [v for v in values if "push_per_s" in v]
    assert server_records, "no server metrics"
    assert all(
        v["staleness_max"] >= v["staleness_median"] >= 0
        for v in server_records
        if "staleness_max" in v
    )
    assert max(v["clock"] for v in values if "clock" in v) > 0
