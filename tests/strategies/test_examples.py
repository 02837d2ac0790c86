"""Every job of ``examples/strategies`` trains: its script (the quickstart's
``train.py``, unchanged) runs as ``__main__`` on warm gloo ranks with the strategy and
parameters the job file gives, as validated by ``dmlctl``'s own loader, and ends above
0.8 test accuracy with the strategy's communication counted in its metrics.

``tests/integration/test_launch.py`` plans each example with ``launch --dry-run`` and
launches one of each family for real; this file is what checks that each one learns.
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
    records = [
        json.loads(line)
        for path in tmp_path.glob("rank-*.events.jsonl")
        for line in path.read_text().splitlines()
    ]
    values = [r.get("values", {}) for r in records if r.get("kind") == "metric"]
    assert any("comm_bytes_per_step" in v for v in values), (example.name, records[:3])
