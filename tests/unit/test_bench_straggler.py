"""Pure tests of ``dmlctl bench straggler``: scenarios, jobs, parsing, ratio math,
rendering, option checks, and the run loop with a fake launcher."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType

from dmlctl.bench.comm import BenchFailed
from dmlctl.bench.straggler import (
    FACTOR,
    JOB_DIR,
    SCENARIOS,
    WORKER_SCRIPT,
    check_options,
    parse_scenarios,
    run_straggler_bench,
    straggler_job,
)
from dmlctl.bench.straggler_report import (
    GOAL,
    Scenario,
    ScenarioResult,
    compare,
    expected_ratio,
    median_rates,
    parse_rates,
    render_straggler_table,
    straggler_json,
)
from dmlctl.cli.app import main
from dmlctl.errors import UsageError
from dmlctl.launch.api import LaunchOptions, LaunchResult
from dmlctl.spec.cluster import ClusterSpec, HostSpec
from dmlctl.spec.models import JobSpec

ASGD = SCENARIOS["asgd"]
SSGD = SCENARIOS["ssgd"]


def render(renderable: RenderableType, width: int = 160) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def record(worker: int, rate: float, *, straggler: bool = False, rank: int | None = None) -> str:
    values = {
        "comm_share": 0.1,
        "bench": "straggler",
        "worker": worker,
        "workers": 3,
        "straggler": int(straggler),
        "steps_per_s": rate,
    }
    return json.dumps(
        {
            "ts": 1.0,
            "host": "local",
            "rank": worker if rank is None else rank,
            "step": 60,
            "values": values,
        }
    )


def result(scenario: Scenario, base: list[float], slow: list[float]) -> ScenarioResult:
    return compare(scenario, dict(enumerate(base)), dict(enumerate(slow)), len(base) - 1, steps=60)


# --- scenarios and options -------------------------------------------------------------


def test_default_scenarios_are_the_issues_settings() -> None:
    assert list(SCENARIOS) == ["ssgd", "asgd", "ssp-s3", "ssp-s12-burst", "sync-ps-b1"]
    assert [(s.strategy, s.workers, s.servers) for s in SCENARIOS.values()] == [
        ("ssgd", 3, 0),
        ("asgd", 3, 1),
        ("ssp", 3, 1),
        ("ssp", 3, 1),
        ("sync-ps", 3, 1),
    ]
    burst = SCENARIOS["ssp-s12-burst"]
    assert burst.params == {"staleness": 12} and burst.burst == (10, 15)
    slow_steps = burst.burst[1] - burst.burst[0]
    assert slow_steps * (FACTOR - 1) <= 12  # the burst stays within s
    assert [s.absorbs for s in SCENARIOS.values()] == [False, True, False, True, True]
    assert SCENARIOS["sync-ps-b1"].params == {"backup_workers": 1}


def test_parse_scenarios_keeps_order_drops_duplicates_and_names_the_valid_ones() -> None:
    assert parse_scenarios("all") == list(SCENARIOS.values())
    assert parse_scenarios("asgd, ssgd,asgd") == [ASGD, SSGD]
    with pytest.raises(UsageError, match=r"'hogwild'.*valid: all, ssgd, asgd, ssp-s3"):
        parse_scenarios("ssgd,hogwild")
    with pytest.raises(UsageError, match="unknown scenario"):
        parse_scenarios("")


@pytest.mark.parametrize(
    ("steps", "sleep", "repeats", "message"),
    [
        (19, 0.03, 1, "--steps"),
        (60, 0.0, 1, "--step-sleep"),
        (60, 1.5, 1, "--step-sleep"),
        (60, 0.03, 0, "--repeats"),
    ],
)
def test_check_options_rejects_bad_values(
    steps: int, sleep: float, repeats: int, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        check_options(steps, sleep, repeats)
    check_options(20, 1.0, 1)


def test_baseline_job_has_no_slowdown_and_no_restarts() -> None:
    job = straggler_job(ASGD, steps=60, step_sleep=0.03, slowed=False)
    assert (job.script, job.workdir) == (WORKER_SCRIPT, str(JOB_DIR))
    assert (JOB_DIR / WORKER_SCRIPT).is_file()
    assert job.args == ["--steps", "60", "--step-sleep", "0.03"]
    assert (job.workers, job.parameter_servers, job.strategy.name) == (3, 1, "asgd")
    assert (job.restart.max_user_restarts, job.restart.max_infra_restarts) == (0, 0)
    assert job.env == {"OMP_NUM_THREADS": "1"}


def test_slowed_job_passes_the_factor_and_the_burst_and_the_strategy_params() -> None:
    ssgd = straggler_job(SSGD, steps=20, step_sleep=0.02, slowed=True)
    assert ssgd.args == ["--steps", "20", "--step-sleep", "0.02", "--factor", "3.0"]
    assert ssgd.parameter_servers == 0
    burst = straggler_job(SCENARIOS["ssp-s12-burst"], steps=60, step_sleep=0.03, slowed=True)
    assert burst.args[-2:] == ["--burst", "10:15"]
    assert burst.strategy.name == "ssp"
    assert burst.strategy.params.model_dump(exclude_unset=True) == {"staleness": 12}


# --- parsing and ratio math ------------------------------------------------------------


def test_parse_rates_reads_worker_records_and_skips_the_rest() -> None:
    lines = [
        record(0, 10.0),
        "",
        "{torn",
        "[1, 2]",
        json.dumps({"rank": 3, "values": {"push_per_s": 5.0, "version": 3.0}}),  # a server
        json.dumps({"values": {"bench": "ps", "worker": 9, "straggler": 0, "steps_per_s": 1}}),
        json.dumps(
            {"values": {"bench": "straggler", "worker": "1", "straggler": 0, "steps_per_s": 2.0}}
        ),
        record(1, 11.0),
        record(0, 12.0),
        record(2, 4.0, straggler=True),
    ]
    assert parse_rates(lines) == ({0: 12.0, 1: 11.0, 2: 4.0}, 2)
    bare = json.dumps({"bench": "straggler", "worker": 0, "straggler": 0, "steps_per_s": 3})
    assert parse_rates([bare]) == ({0: 3.0}, None)


def test_median_rates_per_worker_over_runs() -> None:
    runs = [{0: 10.0, 1: 30.0}, {0: 12.0, 1: 20.0}, {0: 11.0, 1: 10.0, 2: 1.0}]
    assert median_rates(runs) == {0: 11.0, 1: 20.0}
    with pytest.raises(ValueError, match="no runs"):
        median_rates([])


def test_ratio_is_the_smallest_fast_workers_own_ratio_and_ignores_the_straggler() -> None:
    r = result(ASGD, base=[30.0, 20.0, 30.0], slow=[27.0, 19.0, 10.0])
    assert r.fast_ratios == pytest.approx({0: 0.9, 1: 0.95})
    assert r.ratio == pytest.approx(0.9)  # not min(slow)/min(base) = 0.95
    assert r.straggler_pace == pytest.approx(1 / 3)
    assert r.fast_rate(r.baseline) == 20.0 and r.fast_rate(r.slowed) == 19.0
    assert r.passed is True and r.expected is None
    assert result(ASGD, base=[30.0, 30.0, 30.0], slow=[23.0, 30.0, 10.0]).passed is False


def test_no_goal_for_ssgd_and_persistent_ssp_but_an_expected_ratio_from_the_pace() -> None:
    ssgd = result(SSGD, base=[30.0, 30.0, 30.0], slow=[10.0, 10.0, 12.0])
    assert ssgd.passed is None and ssgd.expected == pytest.approx(0.4)  # the straggler's pace
    ssp = SCENARIOS["ssp-s3"]
    assert expected_ratio(ssp, 60, 1 / 3) == pytest.approx(60 / (3 * 57))  # pace + s steps
    assert expected_ratio(ssp, 4, 0.8) == 1.0  # capped
    assert expected_ratio(ASGD, 60, 1 / 3) is None
    assert expected_ratio(SCENARIOS["ssp-s12-burst"], 60, 1 / 3) is None


@pytest.mark.parametrize(
    ("base", "slow", "straggler", "message"),
    [
        ({0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}, 2, "baseline run reported workers"),
        ({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 2: 1.0}, 2, "straggler run reported workers"),
        ({0: 1.0, 1: 0.0, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}, 2, "not positive"),
        ({0: 1.0, 1: float("nan"), 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}, 2, "not positive"),
        ({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}, None, "no straggler"),
    ],
)
def test_compare_rejects_incomplete_or_bad_runs(
    base: dict[int, float], slow: dict[int, float], straggler: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        compare(ASGD, base, slow, straggler, steps=60)


# --- rendering -------------------------------------------------------------------------


def sample_results() -> list[ScenarioResult]:
    return [
        result(SSGD, base=[30.0, 30.0, 30.0], slow=[10.5, 10.6, 10.5]),
        result(ASGD, base=[31.0, 31.0, 31.0], slow=[30.5, 30.0, 10.4]),
        result(SCENARIOS["ssp-s3"], base=[31.0, 31.0, 31.0], slow=[11.0, 11.0, 10.4]),
        result(SCENARIOS["ssp-s12-burst"], base=[31.0, 31.0, 31.0], slow=[20.0, 31.0, 27.0]),
        result(SCENARIOS["sync-ps-b1"], base=[31.0, 31.0, 31.0], slow=[30.0, 30.5, 10.4]),
    ]


def test_table_has_one_row_per_scenario_with_goals_and_marks_only_where_a_goal_applies() -> None:
    out = render(
        render_straggler_table(sample_results(), steps=60, step_sleep=0.03, factor=3.0, repeats=1)
    )
    assert "one worker 3× slower (60 steps, 30 ms sleep per step, 1 run each)" in out
    rows = {
        ln.split()[0]: ln
        for ln in out.splitlines()
        if ln.split()[:1] and ln.split()[0] in SCENARIOS
    }
    assert list(rows) == list(SCENARIOS)
    assert "≈ straggler pace (0.35)" in rows["ssgd"] and "0.350" in rows["ssgd"]
    assert "pass" not in rows["ssgd"] and "FAIL" not in rows["ssgd"]
    assert "3+1 ps" in rows["asgd"] and "≥ 0.8" in rows["asgd"] and "pass" in rows["asgd"]
    assert "≈ straggler pace + s=3 steps (0.35)" in rows["ssp-s3"]  # 10.4/31 · 60/57
    assert "staleness=3" in rows["ssp-s3"]
    assert "pass" not in rows["ssp-s3"] and "FAIL" not in rows["ssp-s3"]
    assert "burst 10:15" in rows["ssp-s12-burst"] and "FAIL" in rows["ssp-s12-burst"]
    assert "backup_workers=1" in rows["sync-ps-b1"] and "pass" in rows["sync-ps-b1"]


def test_json_carries_per_worker_rates_ratios_and_goals() -> None:
    data = straggler_json(
        sample_results(), steps=60, step_sleep=0.03, factor=3.0, repeats=2, run_ids=["a", "b"]
    )
    assert json.loads(json.dumps(data)) == data
    assert (data["steps"], data["factor"], data["repeats"], data["goal"]) == (60, 3.0, 2, GOAL)
    by_name = {s["name"]: s for s in data["scenarios"]}
    asgd = by_name["asgd"]
    assert asgd["baseline_steps_per_s"] == {"0": 31.0, "1": 31.0, "2": 31.0}
    assert set(asgd["fast_ratios"]) == {"0", "1"} and asgd["straggler"] == 2
    assert asgd["ratio"] == pytest.approx(30.0 / 31.0) and asgd["passed"] is True
    assert (asgd["servers"], asgd["goal"], asgd["expected"]) == (1, GOAL, None)
    ssgd = by_name["ssgd"]
    assert ssgd["goal"] is None and ssgd["passed"] is None
    assert ssgd["expected"] == pytest.approx(ssgd["straggler_pace"])
    assert by_name["ssp-s12-burst"]["burst"] == [10, 15]


# --- the run loop, with a fake launcher ------------------------------------------------


class FakeLauncher:
    """Writes each run's metrics.jsonl from ``rates(job)``; records the jobs it got."""

    def __init__(self, tmp: Path, rates: Any, exit_code: int = 0) -> None:
        self.tmp, self.rates, self.exit_code = tmp, rates, exit_code
        self.calls: list[tuple[JobSpec, ClusterSpec]] = []

    def __call__(
        self, job: JobSpec, cluster: ClusterSpec, *, options: LaunchOptions, console: Console
    ) -> LaunchResult:
        assert options.ui == "quiet"
        self.calls.append((job, cluster))
        run_dir = self.tmp / f"run{len(self.calls)}"
        run_dir.mkdir()
        got: Mapping[int, float] = self.rates(job)
        last = max(got)
        lines = [record(w, r, straggler=w == last) for w, r in got.items()]
        (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return LaunchResult(run_dir.name, run_dir, None, self.exit_code)


def two_slot_cluster() -> ClusterSpec:
    return ClusterSpec(hosts=[HostSpec(name="local", address="localhost", slots=2)])


def quiet() -> Console:
    return Console(file=io.StringIO())


def test_run_loop_alternates_sides_takes_medians_and_widens_the_local_cluster(
    tmp_path: Path,
) -> None:
    rounds = iter([30.0, 10.0, 20.0, 12.0, 31.0, 11.0])  # base, slow, base, slow, …

    def rates(job: JobSpec) -> dict[int, float]:
        fast = next(rounds)
        return {0: fast, 1: fast, 2: 10.0 if "--factor" in job.args else 30.0}

    fake = FakeLauncher(tmp_path, rates)
    results, run_ids = run_straggler_bench(
        [ASGD],
        steps=20,
        step_sleep=0.02,
        repeats=3,
        console=quiet(),
        cluster=two_slot_cluster(),
        launcher=fake,
    )
    assert run_ids == [f"run{i}" for i in range(1, 7)]
    assert ["--factor" in job.args for job, _ in fake.calls] == [False, True] * 3
    assert all(cluster.total_slots == 4 for _, cluster in fake.calls)
    (r,) = results
    assert r.baseline == {0: 30.0, 1: 30.0, 2: 30.0}  # median of 30, 20, 31
    assert r.slowed == {0: 11.0, 1: 11.0, 2: 10.0}
    assert r.ratio == pytest.approx(11 / 30) and r.straggler == 2


def test_run_loop_reports_a_failed_run_and_missing_workers(tmp_path: Path) -> None:
    failing = FakeLauncher(tmp_path / "a", lambda job: {0: 1.0, 1: 1.0, 2: 1.0}, exit_code=1)
    (tmp_path / "a").mkdir()
    with pytest.raises(BenchFailed, match="run1 failed: exit code 1"):
        run_straggler_bench(
            [SSGD],
            steps=20,
            step_sleep=0.02,
            repeats=1,
            console=quiet(),
            cluster=two_slot_cluster(),
            launcher=failing,
        )
    short = FakeLauncher(tmp_path / "b", lambda job: {0: 1.0, 1: 1.0})
    (tmp_path / "b").mkdir()
    with pytest.raises(BenchFailed, match="steps/s for 2 of 3 workers"):
        run_straggler_bench(
            [SSGD],
            steps=20,
            step_sleep=0.02,
            repeats=1,
            console=quiet(),
            cluster=two_slot_cluster(),
            launcher=short,
        )


# --- the command's option checks -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--steps", "5"], "--steps must be at least 20"),
        (["--step-sleep", "0"], "--step-sleep must be in"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--scenarios", "ssgd,nope"], "unknown scenario(s) 'nope'"),
    ],
)
def test_cli_rejects_bad_options_before_launching(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    expected: str,
) -> None:
    monkeypatch.setenv("DMLCTL_HOME", str(tmp_path))
    assert main(["bench", "straggler", *args]) == 2
    out, err = capsys.readouterr()
    assert expected in err and "Traceback" not in out + err
    assert not (tmp_path / "runs").exists()
