"""`dmlctl bench recovery --repeats 1` end to end: a real SIGKILL and restart under
dmlctl and under bare torchrun, both measured (about 30 s on 2 cores)."""

from __future__ import annotations

import json

import pytest

from dmlctl.bench.recovery import KILL_AT
from tests.conftest import Cli

pytestmark = pytest.mark.integration


def test_recovery_bench_measures_both_launchers(cli: Cli) -> None:
    proc = cli.run("bench", "recovery", "--repeats", "1", "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)  # stdout carries only the result
    assert "dmlctl 1/1" in proc.stderr and "torchrun 1/1" in proc.stderr
    assert proc.stderr.startswith("dmlctl bench recovery: 2 runs (1 × 2 launchers) of about ")
    every = report["checkpoint_every"]
    assert (report["repeats"], report["backoff_s"], every) == (1, 0.1, 5)
    assert report["ratio"] > 0
    for side in ("dmlctl", "torchrun"):
        result = report[side]
        assert result["recovery_s"]["median"] > 0, side
        (run,) = result["runs"]
        assert run["kill_time"] > 0 and run["first_step_time"] > run["kill_time"], side
        # The kill came after step KILL_AT; the last checkpoint before it is the
        # multiple of the interval at or below it.
        assert (run["steps_done"], run["resumed_from"]) == (KILL_AT, KILL_AT // every * every)
        assert 0 <= result["steps_lost"] <= every, side
        stages = run["stages_s"]
        assert stages["first_step"] == pytest.approx(run["recovery_s"])
        for key in ("workers_stopped", "script_started", "torch_imported", "resumed"):
            assert stages[key] > 0, (side, key)
        assert list(stages.values()) == sorted(stages.values()), (side, stages)
    assert report["dmlctl"]["runs"][0]["cause"]  # what dmlctl recorded as the failure
    dml_stages = report["dmlctl"]["runs"][0]["stages_s"]
    for key in ("controller_notified", "agent_started", "rank_started"):
        # The new agent waits for the backoff after the controller has the failure.
        assert dml_stages[key] > 0, key
    assert dml_stages["agent_started"] - dml_stages["controller_notified"] >= 0.1
    assert cli.runs() == []  # run directories went to a temporary DMLCTL_HOME
