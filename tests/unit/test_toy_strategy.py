"""Adding a strategy is one package and one registry line: a toy strategy in a
temporary package, declared with its capabilities, is listed by ``dmlctl strategies``,
planned with its parameters by the dry run, checked by its own world check, and its
ranks' column shows on the dashboard."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dmlctl.cli.app import app
from dmlctl.errors import PlanError
from dmlctl.plan.build import build_plan
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.render import render_plan
from dmlctl.runs.events import MetricRecord, RankStarted
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import new_run_state
from dmlctl.spec import default_cluster
from dmlctl.spec.loader import load_job
from dmlctl.strategies import registry
from dmlctl.ui.format import rank_table

TOY_PARAMS = """
from pydantic import BaseModel, Field

from dmlctl.strategies.params import PARAMS_CONFIG, WORKERS_ONLY, Capabilities

QUALITY = "a toy: it trains nothing better than ssgd"


class Params(BaseModel):
    model_config = PARAMS_CONFIG
    period: int = Field(default=3, ge=1, le=100, description="steps between averages")


def check_world(params: Params, world_size: int) -> str | None:
    return "a toy runs on one worker" if world_size > 1 else None


CAPABILITIES = Capabilities(roles=WORKERS_ONLY, columns=("consensus",), check_world=check_world)
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    package = tmp_path / "toy_strategy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "params.py").write_text(TOY_PARAMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = registry.StrategyEntry("toy", "toy_strategy", "a toy strategy, added by a test")
    monkeypatch.setitem(registry._REGISTRY, "toy", entry)  # the one registry line
    yield "toy"
    sys.modules.pop("toy_strategy.params", None)
    sys.modules.pop("toy_strategy", None)


def _job(tmp_path: Path, workers: int) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: toyjob\nscript: train.py\nworkers: {workers}\n"
        "strategy:\n  name: toy\n  params: {period: 7}\n"
    )
    return job


def _plan(tmp_path: Path, workers: int) -> LaunchPlan:
    job = load_job(_job(tmp_path, workers))
    return build_plan(
        default_cluster(),
        job,
        run_id="r-1",
        rdzv_port=29500,
        local_python=sys.executable,
        local_run_dir=str(tmp_path / "run"),
    )


def test_a_toy_strategy_is_listed_planned_checked_and_shown(toy: str, tmp_path: Path) -> None:
    listed = CliRunner().invoke(app, ["strategies"])
    assert listed.exit_code == 0 and "a toy strategy, added by a test" in listed.output
    shown = CliRunner().invoke(app, ["strategies", "toy"])
    assert shown.exit_code == 0 and "steps between averages" in shown.output
    assert "quality: a toy" in shown.output

    plan = _plan(tmp_path, 1)
    text = render_plan(plan)
    assert "strategy toy, 1 worker" in text and "strategy params: period=7" in text
    assert "DMLCTL_STRATEGY=toy" in text
    with pytest.raises(PlanError, match="a toy runs on one worker"):
        _plan(tmp_path, 2)

    state = new_run_state("r-1", "toyjob", "toy", [(0, "local", "worker")], 0.0)
    state = apply(
        state,
        [
            RankStarted("local", 0, 0, "worker", 1, 1.0),
            MetricRecord("local", 0, 3, {"consensus": 0.01}, 2.0),
        ],
    )
    console = Console(width=160, record=True)
    console.print(rank_table(state.ranks))
    assert "consensus" in console.export_text()
