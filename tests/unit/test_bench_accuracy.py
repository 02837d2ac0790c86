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


@pytest.mark.parametrize("task", list(accuracy.TASKS.values()), ids=list(accuracy.TASKS))
def test_every_job_file_is_a_valid_job(task: accuracy.Task) -> None:
    for candidate in (accuracy.BASELINE, *task.candidates):
        spec = accuracy.job_spec(candidate, task.optimizers[0], 3, task)
        job = JobSpec.model_validate(spec)
        assert job.workers == (1 if candidate is accuracy.BASELINE else 2)
        assert spec["args"] == ["--optimizer", task.optimizers[0], "--epochs", "3"]
        assert (Path(spec["workdir"]) / spec["script"]).is_file()
        assert spec["script"] == task.script
    ps = accuracy.job_spec(accuracy.Candidate("asgd", "asgd", servers=1), "momentum", 1)
    assert ps["parameter_servers"] == 1


def test_the_value_is_rank_0s_last_record_of_the_metric(tmp_path: Path) -> None:
    records = [
        {"rank": 1, "step": 9, "values": {"loss": 0.1, "val_loss": 0.5}},
        {"rank": 0, "step": 9, "values": {"loss": 0.2}},
        {"rank": 0, "step": 10, "values": {"test_acc": 0.9722, "val_loss": 0.64}},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    assert accuracy.logged_value(tmp_path) == pytest.approx(0.9722)
    assert accuracy.logged_value(tmp_path, "val_loss") == pytest.approx(0.64)
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[0]))
    with pytest.raises(accuracy.AccuracyBenchFailed, match="logged no test_acc"):
        accuracy.logged_value(tmp_path)


def test_a_missing_scikit_learn_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "sklearn" else real(name)
    )
    with pytest.raises(UsageError) as info:
        accuracy.require_sklearn()
    assert str(info.value) == "dmlctl bench accuracy needs scikit-learn: pip install scikit-learn"
    assert info.value.exit_code == 2


def _table(report: dict[str, object]) -> dict[str, str]:
    console = Console(width=120, record=True, color_system=None)
    console.print(accuracy.render_accuracy_table(report))
    text = console.export_text()
    return {line.split()[0]: line for line in text.splitlines() if line.strip()}


def test_the_digits_table_shows_deltas_in_points_and_the_verdict() -> None:
    rows = [
        {"name": "bmuf", "value": {"momentum": 0.9722, "adam": 0.9806}},
        {"name": "easgd", "value": {"momentum": 0.131, "adam": 0.9778}},
    ]
    baseline = {"momentum": 0.975, "adam": 0.9806}
    report = accuracy.verdict(accuracy.TASKS["digits"], ["momentum", "adam"], 20, baseline, rows)
    assert [r["ok"] for r in report["rows"]] == [True, False]
    lines = _table(report)
    assert "0.9750" in lines["single"]
    assert "0.9722 (-0.3)" in lines["bmuf"] and "0.1310 (-84.4)" in lines["easgd"]
    assert lines["bmuf"].rstrip().endswith("yes (1.5 pts)")
    assert lines["easgd"].rstrip().endswith("no (1.5 pts)")


def test_the_lm_table_holds_losses_to_3_percent_and_ssgd_to_half_a_percent() -> None:
    baseline = {"adamw": 0.6, "nesterov": 0.7}
    rows = [
        {"name": "ssgd", "value": {"adamw": 0.6029, "nesterov": 0.7}},  # +0.48 %
        {"name": "local-sgd", "value": {"adamw": 0.6179, "nesterov": 0.65}},  # +2.98 %
        {"name": "admm", "value": {"adamw": 0.6, "nesterov": 0.7217}},  # +3.1 %
        {"name": "dpsgd", "value": {"adamw": 0.6031, "nesterov": 0.7}},  # +0.52 %
    ]
    task = accuracy.TASKS["lm"]
    report = accuracy.verdict(task, list(task.optimizers), 3, baseline, rows)
    assert [r["ok"] for r in report["rows"]] == [True, True, False, True]
    worse = accuracy.verdict(
        task, ["adamw"], 3, baseline, [{"name": "ssgd", "value": {"adamw": 0.6031}}]
    )
    assert not worse["rows"][0]["ok"]  # +0.52 %: ssgd is held to 0.5 %
    lines = _table(report)
    assert "0.6029 (+0.5 %)" in lines["ssgd"] and lines["ssgd"].rstrip().endswith("yes (0.5 %)")
    assert "0.6500 (-7.1 %)" in lines["local-sgd"]
    assert lines["admm"].rstrip().endswith("no (3 %)")


def test_the_bench_says_its_runs_and_about_how_long_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dmlctl.cli.app import main

    lm = accuracy.TASKS["lm"]
    assert lm.planned(15, 2, 3) == (
        "30 runs (15 rows × 2 optimizers) of about 8 s each on 2 cores: about 0:03:57"
    )
    assert "of about 13 s each" in lm.planned(15, 2, 6)  # the epochs part grows

    def refuse(*_args: object, **_kw: object) -> None:
        raise UsageError("(not run here)")

    monkeypatch.setattr(accuracy, "run_accuracy_bench", refuse)
    assert main(["bench", "accuracy", "--task", "lm", "--strategies", "ssgd,bmuf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dmlctl bench accuracy: 6 runs (3 rows × 2 optimizers)"), err


def test_plain_sgd_runs_only_when_named_and_only_for_the_language_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--optimizers sgd`` (the optimizer adadelay runs, to compare it with its own
    kind) is a language-model choice the default pair leaves out."""
    from dmlctl.cli.app import main

    asked: list[list[str]] = []

    def record(_rows: object, opts: list[str], *_args: object) -> None:
        asked.append(list(opts))
        raise UsageError("(not run here)")

    monkeypatch.setattr(accuracy, "run_accuracy_bench", record)
    assert main(["bench", "accuracy", "--task", "lm", "--strategies", "adadelay"]) == 2
    assert main(["bench", "accuracy", "--task", "lm", "--optimizers", "sgd,adamw"]) == 2
    assert asked == [["adamw", "nesterov"], ["adamw", "sgd"]]
    assert main(["bench", "accuracy", "--optimizers", "sgd"]) == 2  # digits: no such row
    err = capsys.readouterr().err
    assert "unknown optimizer sgd; valid: momentum, adam" in err
    assert accuracy.TASKS["lm"].labels["sgd"] == "plain SGD"
