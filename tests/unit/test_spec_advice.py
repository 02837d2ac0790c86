"""``strategy: {name: auto, advice: FILE}``: the job takes the strategy and servers of
an advice file (as ``bench advise --save`` writes it), validated like any job file;
what is wrong is one issue naming the job file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dmlctl.bench.advise import save_advice
from dmlctl.errors import SpecError
from dmlctl.spec.loader import load_job

ADVICE = {
    "target": "test_acc>=0.9",
    "scenario": "lab 100mbit",
    "why": "reached test_acc>=0.9 in 29.1 s, 3.3× sooner than ssgd",
    "strategy": {"name": "local-sgd", "params": {"period": 8}},
    "parameter_servers": 0,
}


def _job(tmp_path: Path, strategy: str, advice: object = ADVICE, extra: str = "") -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    if advice is not None:
        (tmp_path / "advice.yaml").write_text(yaml.safe_dump(advice))
    job = tmp_path / "job.yaml"
    job.write_text(f"script: train.py\nworkers: 2\nstrategy: {strategy}\n{extra}")
    return job


def test_the_advised_strategy_and_servers_replace_auto_with_a_note(tmp_path: Path) -> None:
    job = load_job(_job(tmp_path, "{name: auto, advice: advice.yaml}"))
    assert job.strategy.name == "local-sgd" and job.strategy.params.period == 8  # type: ignore[attr-defined]
    assert job.parameter_servers == 0
    assert job.advice == (
        "strategy local-sgd period=8 from advice.yaml: reached test_acc>=0.9 in 29.1 s, "
        "3.3× sooner than ssgd (lab 100mbit)"
    )
    servers = load_job(
        _job(
            tmp_path,
            "{name: auto, advice: advice.yaml}",
            {**ADVICE, "strategy": {"name": "asgd"}, "parameter_servers": 1},
        )
    )
    assert (servers.strategy.name, servers.parameter_servers) == ("asgd", 1)
    assert load_job(_job(tmp_path, "ssgd")).advice is None


@pytest.mark.parametrize(
    ("strategy", "advice", "extra", "message"),
    [
        ("auto", ADVICE, "", "job.yaml:3 strategy: strategy auto takes exactly an advice file"),
        ("{name: auto, advice: gone.yaml}", ADVICE, "", "gone.yaml: No such file or directory"),
        ("{name: auto, advice: advice.yaml}", ["a"], "", "advice.yaml is not a mapping"),
        (
            "{name: auto, advice: advice.yaml}",
            {**ADVICE, "why": None},
            "",
            "'why' missing or not a str",
        ),
        (
            "{name: auto, advice: advice.yaml}",
            {**ADVICE, "strategy": {"name": "local-sgd", "params": {"period": 0}}},
            "",
            "strategy.params.period",
        ),
        ("ssgd", None, "advice: mine\n", "job.yaml:4 advice: is set by dmlctl"),
    ],
)
def test_a_bad_advice_is_an_issue_of_the_job_file(
    tmp_path: Path, strategy: str, advice: object, extra: str, message: str
) -> None:
    with pytest.raises(SpecError) as info:
        load_job(_job(tmp_path, strategy, advice, extra))
    assert message in str(info.value), str(info.value)


def test_bench_advise_saves_what_a_job_then_loads(tmp_path: Path) -> None:
    row = {
        "label": "local-sgd period=8",
        "run_id": "advise-local-sgd-1",
        "candidate": {"strategy": "local-sgd", "params": {"period": 8}, "servers": 0},
    }
    report = {
        "target": "test_acc>=0.9",
        "scenarios": [
            {
                "name": "lab 100mbit",
                "candidates": [row],
                "recommendation": {"label": row["label"], "why": ADVICE["why"], "snippet": ""},
            }
        ],
    }
    assert save_advice(report, tmp_path / "advice.yaml") == "local-sgd period=8"
    job = load_job(_job(tmp_path, "{name: auto, advice: advice.yaml}", advice=None))
    assert job.advice is not None and job.advice.startswith("strategy local-sgd period=8 from")
    report["scenarios"][0]["recommendation"] = None
    assert save_advice(report, tmp_path / "none.yaml") is None
    assert not (tmp_path / "none.yaml").exists()
