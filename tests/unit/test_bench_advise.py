"""``dmlctl bench advise``: parsing of candidates, target and budget; reading a run's
records into time and bytes to target; ranking, the table and the recommendation."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from dmlctl.bench.advise_report import (
    BUDGET,
    FAILED,
    NOT_REACHED,
    REACHED,
    Outcome,
    advice_notes,
    analyse,
    moves_table,
    rank,
    recommendation,
    render_advice_table,
    snippet,
    target_reached,
)
from dmlctl.bench.advise_spec import (
    Candidate,
    Scenario,
    Target,
    parse_budget,
    parse_candidates,
    parse_scenarios,
    parse_target,
)
from dmlctl.errors import UsageError
from dmlctl.runs.state import RunState

T0 = 1_700_000_000.0
TARGET = Target("test_acc", ">=", 0.9)


def test_target_parses_both_directions_and_names_the_option_when_wrong() -> None:
    assert parse_target("test_acc>=0.97") == Target("test_acc", ">=", 0.97)
    low = parse_target(" loss <= 1e-2 ")
    assert low == Target("loss", "<=", 0.01) and not low.higher_is_better
    assert low.reached(0.01) and not low.reached(0.02)
    assert str(low) == "loss<=0.01"
    for bad in ("test_acc=0.9", "0.9<=acc", "acc>=high", "acc>=nan"):
        with pytest.raises(UsageError, match="--target"):
            parse_target(bad)


def test_budget_takes_seconds_minutes_hours() -> None:
    assert [parse_budget(b) for b in ("90", "90s", "10m", "1.5h")] == [90, 90, 600, 5400]
    for bad in ("0", "-3m", "10 minutes", ""):
        with pytest.raises(UsageError, match="--budget"):
            parse_budget(bad)


def test_candidates_expand_grids_type_values_and_give_servers_where_needed() -> None:
    got = parse_candidates("ssgd, local-sgd:period=4|16, asgd, ssgd:compression=fp16", 0)
    assert [c.label for c in got] == [
        "ssgd",
        "local-sgd period=4",
        "local-sgd period=16",
        "asgd",
        "ssgd compression=fp16",
    ]
    assert got[1].params == {"period": 4}  # an int, as the strategy's model wants
    assert [c.servers for c in got] == [0, 0, 0, 1, 0]
    assert parse_candidates("asgd", 2)[0].servers == 2  # the job's own count is kept
    assert len(parse_candidates("ssgd,ssgd", 0)) == 1
    grid = parse_candidates("local-sgd:period=2|4;final=local|consensus", 0)
    assert len(grid) == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("local_sgd", "did you mean 'local-sgd'"),
        ("local-sgd:period=zero", "--strategies 'local-sgd:period=zero': period"),
        ("local-sgd:perod=4", "perod"),
        ("ssgd:compression", "is not KEY=VALUE"),
        (" , ", "no candidate given"),
    ],
)
def test_a_bad_candidate_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_candidates(text, 0)
    assert message in str(info.value) and "\n" not in str(info.value)


def _run(
    tmp_path: Path, records: list[tuple[float, int, dict[str, float]]], code: int, name: str = "r1"
) -> Path:
    run = tmp_path / name
    run.mkdir()
    state = RunState(name, "job", "ssgd", 2, ("local",), T0, exit_code=code, ended_at=T0 + 30)
    (run / "state.json").write_text(json.dumps(state.to_dict()))
    lines = [
        json.dumps({"ts": T0 + t, "host": "local", "rank": r, "step": 1, "values": v})
        for t, r, v in records
    ]
    (run / "metrics.jsonl").write_text("\n".join([*lines, "torn {"]) + "\n")
    return run


def test_time_and_bytes_to_target_from_the_first_record_that_meets_it(tmp_path: Path) -> None:
    sent = "comm_bytes_total"
    records = [
        (5.0, 0, {sent: 100, "samples_per_s": 1000, "comm_seconds_total": 1, "comm_wall_total": 4}),
        (5.5, 1, {sent: 100, "samples_per_s": 900, "comm_seconds_total": 1, "comm_wall_total": 2}),
        (6.0, 0, {"test_acc": 0.5}),
        (6.0, 1, {"test_acc": 0.5}),  # all-reduced, logged twice: counted once
        (8.0, 0, {sent: 300, "samples_per_s": 1200}),
        (8.5, 1, {sent: 250}),
        (9.0, 0, {"test_acc": 0.93}),
        (9.5, 1, {sent: 400}),
        (12.0, 0, {"test_acc": 0.95}),
    ]
    run = _run(tmp_path, records, 0)
    assert target_reached(run / "metrics.jsonl", TARGET)
    assert not target_reached(run / "metrics.jsonl", Target("test_acc", ">=", 0.99))
    got = analyse(Candidate("ssgd"), TARGET, run, over_budget=False)
    assert got.status == REACHED and got.run_id == "r1"
    assert got.time_to_target_s == pytest.approx(9.0)
    assert got.bytes_to_target == 550  # 300 from rank 0 + 250 from rank 1 by then
    assert got.final == 0.95 and got.bytes_total == 700 and got.wall_s == 30
    assert got.samples_per_s == pytest.approx(1100 + 900)  # medians, added
    assert got.comm_share == pytest.approx((0.25 + 0.5) / 2)
    assert [p[2] for p in got.curve] == [0.5, 0.93, 0.95]


def test_not_reached_budget_and_failed(tmp_path: Path) -> None:
    records = [(6.0, 0, {"test_acc": 0.5})]
    run = _run(tmp_path, records, 0)
    assert analyse(Candidate("ssgd"), TARGET, run, over_budget=False).status == NOT_REACHED
    stopped = analyse(Candidate("ssgd"), TARGET, run, over_budget=True)
    assert stopped.status == BUDGET and stopped.final == 0.5
    failed_run = _run(tmp_path, records, 1, name="r2")
    failed = analyse(Candidate("ssgd"), TARGET, failed_run, over_budget=False)
    assert failed.status == FAILED and failed.detail == "exit code 1"


def _outcome(label: str, status: str, time: float | None, final: float | None) -> Outcome:
    strategy, _, period = label.partition(" ")
    params = {"period": int(period)} if period else {}
    return Outcome(
        Candidate(strategy, params),
        status,
        run_id=f"run-{label}",
        time_to_target_s=time,
        bytes_to_target=None if time is None else 1000.0 / (int(period or 1)),
        final=final,
        curve=((time or 1.0, 0.0, final or 0.0),),
    )


def test_ranking_recommendation_snippet_and_table() -> None:
    outcomes = [
        _outcome("ssgd", REACHED, 20.0, 0.95),
        _outcome("bmuf", FAILED, None, None),
        _outcome("dpsgd", BUDGET, None, 0.85),
        _outcome("local-sgd 8", REACHED, 8.0, 0.94),
        _outcome("easgd", NOT_REACHED, None, 0.88),
    ]
    ranked = rank(outcomes, TARGET)
    assert [o.candidate.strategy for o in ranked] == ["local-sgd", "ssgd", "easgd", "dpsgd", "bmuf"]
    best = recommendation(ranked, TARGET)
    assert best is not None and best["label"] == "local-sgd period=8"
    assert best["why"] == (
        "reached test_acc>=0.9 in 8.0 s, 2.5× sooner than ssgd with 8.0× fewer bytes sent"
    )
    assert best["snippet"] == "strategy:\n  name: local-sgd\n  params:\n    period: 8"
    assert snippet(Candidate("asgd", servers=1)) == "strategy:\n  name: asgd\nparameter_servers: 1"
    assert recommendation([o for o in ranked if o.status != REACHED], TARGET) is None
    report = {
        "name": "this machine",
        "target": "test_acc>=0.9",
        "budget_s": 600.0,
        "candidates": [json.loads(json.dumps(o.to_dict())) for o in ranked],
    }
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render_advice_table(report))
    rows = [line for line in out.getvalue().splitlines() if line[:1].isdigit()]
    assert [row.split()[2] for row in rows] == ["local-sgd", "ssgd", "easgd", "dpsgd", "bmuf"]
    assert "8.0" in rows[0] and "1000 B" in rows[1] and "budget" in rows[3]
    notes = advice_notes(report)
    assert notes[0] == "1. local-sgd period=8: run run-local-sgd 8"
    assert notes[-1] == "5. bmuf: run run-bmuf failed: "


def test_scenarios_the_cluster_first_then_labs_then_a_straggler(tmp_path: Path) -> None:
    assert parse_scenarios(None, [], None) == [Scenario("this machine")]
    cluster = tmp_path / "c.yaml"
    got = parse_scenarios(cluster, ["100mbit", "10mbit", "100mbit"], "3x")
    assert [s.name for s in got] == [
        "cluster c.yaml",
        "lab 100mbit",
        "lab 10mbit",
        "cluster c.yaml, straggler 3x",
    ]
    assert got[1].lab_bandwidth == 100_000_000 and got[1].cluster_file is None
    assert got[3].straggler == 3.0 and got[3].cluster_file == cluster
    for bad in ("1x", "fast", "0.5"):
        with pytest.raises(UsageError, match="--straggler"):
            parse_scenarios(None, [], bad)
    with pytest.raises(UsageError, match="--lab '100mbps'"):
        parse_scenarios(None, ["100mbps"], None)


def test_the_moves_table_shows_each_candidates_place_per_scenario() -> None:
    fast, slow = _outcome("local-sgd 8", REACHED, 8.0, 0.94), _outcome("ssgd", REACHED, 20.0, 0.95)
    report = {
        "target": "test_acc>=0.9",
        "scenarios": [
            {"name": "this machine", "candidates": [slow.to_dict(), fast.to_dict()]},
            {"name": "lab 10mbit", "candidates": [fast.to_dict(), slow.to_dict()]},
        ],
    }
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(moves_table(report))
    text = out.getvalue()
    ssgd = next(line for line in text.splitlines() if line.startswith("ssgd"))
    assert ssgd.replace("│", " ").split()[1:] == ["#1", "20.0", "#2", "20.0"], text


def test_a_straggler_sleeps_its_factor_less_one_times_each_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dmlctl.runtime import straggler

    clock = iter([0.0, 0.5, 1.0, 1.2])
    slept: list[float] = []
    monkeypatch.setattr(straggler.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(straggler.time, "sleep", slept.append)
    assert list(straggler.paced(iter("ab"), 3.0)) == ["a", "b"]
    assert slept == [pytest.approx(1.0), pytest.approx(0.4)]  # 2 x 0.5 s, 2 x 0.2 s
    monkeypatch.setenv("DMLCTL_STRAGGLER", "3")
    assert straggler.straggler_factor(1, 2) == 3.0 and straggler.straggler_factor(0, 2) == 1.0
    monkeypatch.setenv("DMLCTL_STRAGGLER", "slow")
    with pytest.raises(ValueError, match="DMLCTL_STRAGGLER='slow'"):
        straggler.straggler_factor(1, 2)


def test_each_candidate_checkpoints_in_a_directory_of_its_own(tmp_path: Path) -> None:
    """A job with a fixed checkpoint.dir: every candidate's run gets a directory of its
    own there, so none resumes (or refuses) another candidate's checkpoint."""
    from dmlctl.bench.advise import AdviseRequest, candidate_job
    from dmlctl.bench.advise_spec import Candidate, Scenario, parse_target
    from dmlctl.spec.loader import load_job

    (tmp_path / "train.py").write_text("")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "script: train.py\nworkers: 2\ncheckpoint:\n  every_steps: 5\n  dir: /ckpt/mine\n"
    )
    request = AdviseRequest(
        job_file, load_job(job_file), [Candidate("ssgd")], parse_target("loss<=1"), 60.0, []
    )
    raw = candidate_job(request, Candidate("bmuf"), Scenario("this machine"))
    assert raw["checkpoint"] == {"every_steps": 5, "dir": "/ckpt/mine/{run_id}"}
    job_file.write_text("script: train.py\ncheckpoint:\n  dir: /ckpt/{run_id}/x\n")
    raw = candidate_job(request, Candidate("bmuf"), Scenario("this machine"))
    assert raw["checkpoint"] == {"dir": "/ckpt/{run_id}/x"}  # already one per run
