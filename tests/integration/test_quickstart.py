"""The README's quick start: ``dmlctl launch examples/quickstart/job.yaml`` trains on this
machine's embedded default cluster and succeeds (every rank trained)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, Cli

pytestmark = [pytest.mark.integration, pytest.mark.compat]


def test_the_quick_start_trains_and_succeeds(cli: Cli) -> None:
    job = REPO / "examples" / "quickstart" / "job.yaml"
    proc = cli.run("launch", str(job), "--ui", "quiet", "--ranks", "fresh")  # the default
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = cli.state(cli.runs()[-1].name)
    assert state["phase"] == "succeeded", state
    assert {r["status"] for r in state["ranks"]} == {"succeeded"}
    assert all((r.get("step") or 0) > 0 for r in state["ranks"]), state["ranks"]
