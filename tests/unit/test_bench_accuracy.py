"""``dmlctl bench accuracy``'s torch-free parts: choosing rows, the job file of a
run, reading the logged accuracy, the verdict and the table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from rich.console import Console

from dmlctl.bench import accuracy
from dmlctl.errors import UsageError
from dmlctl.spec import JobSpec


def test_pick_keeps_the_table_order_and_names_the_valid_choices() -> None:
    assert accuracy.pick(None, ["a", "b"], "strategy") == ["a", "b"]
    assert accuracy.pick("b, a", ["a", "b"], "strategy") == ["a", "b"]
    with pytest.raises(UsageError, match="unknown strategy local_sgd; valid: a, b"):
        accuracy.pick("local_sgd", ["a", "b"], "strategy")


def test_every_job_file_is_a_valid_job() -> None:
    for candidate in (accuracy.BASELINE, *accuracy.CANDIDATES):
        spec = accuracy.job_spec(candidate, "adam", 3)
        job = JobSpec.model_validate(spec)
        assert job.workers == (1 if candidate is accuracy.BASELINE else 2)
        assert spec["args"] == ["--optimizer", "adam", "--epochs", "3"]
        assert (Path(spec["workdir"]) / spec["script"]).is_file()
    ps = accuracy.job_spec(accuracy.Candidate("asgd", "asgd", servers=1), "momentum", 1)
    assert ps["parameter_servers"] == 1


def test_the_accuracy_is_rank_0s_last_test_acc(tmp_path: Path) -> None:
    records = [
        {"rank": 1, "step": 9, "values": {"loss": 0.1}},
        {"rank": 0, "step": 9, "values": {"loss": 0.2}},
        {"rank": 0, "step": 10, "values": {"test_acc": 0.9722}},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    assert accuracy.logged_accuracy(tmp_path) == pytest.approx(0.9722)
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[0]))
    with pytest.raises(accuracy.AccuracyBenchFailed, match="logged no test_acc"):
        accuracy.logged_accuracy(tmp_path)


def test_a_missing_scikit_learn_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "sklearn" else real(name)
    )
    with pytest.raises(UsageError) as info:
        accuracy.require_sklearn()
    assert str(info.value) == "dmlctl bench accuracy needs scikit-learn: pip install scikit-learn"
    assert info.value.exit_code == 2


def test_the_table_shows_deltas_and_the_verdict() -> None:
    report = {
        "data": "digits",
        "workers": 2,
        "epochs": 20,
        "optimizers": ["momentum", "adam"],
        "tolerance": 0.015,
        "baseline": {"momentum": 0.975, "adam": 0.9806},
        "rows": [
            {
                "name": "bmuf",
                "accuracy": {"momentum": 0.9722, "adam": 0.9806},
                "delta": {"momentum": -0.0028, "adam": 0.0},
                "ok": True,
            },
            {
                "name": "easgd",
                "accuracy": {"momentum": 0.131, "adam": 0.9778},
                "delta": {"momentum": -0.844, "adam": -0.0028},
                "ok": False,
            },
        ],
    }
    console = Console(width=100, record=True, color_system=None)
    console.print(accuracy.render_accuracy_table(report))
    text = console.export_text()
    assert "single process" in text and "0.9750" in text
    assert "0.9722 (-0.3)" in text and "0.1310 (-84.4)" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert lines["bmuf"].rstrip().endswith("yes")
    assert lines["easgd"].rstrip().endswith("no")
