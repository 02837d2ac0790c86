"""Every bench says its planned runs and about how long before it starts (issue 31,
item 10): the counts match the loops that make the runs, the wording, and the order
(the plan before the first run, no plan for options it refuses)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dmlctl.bench import (
    comm,
    hangs,
    launch_overhead,
    logs,
    parallel,
    ps,
    recovery,
    sparse,
    straggler,
)
from dmlctl.bench import strategies as strategies_bench
from dmlctl.bench.plan import planned
from dmlctl.bench.report import Sweep
from dmlctl.bench.runs import BenchInterrupted, BenchPartial
from dmlctl.bench.straggler_report import Scenario
from dmlctl.errors import UsageError
from dmlctl.launch.api import LaunchResult
from dmlctl.spec import default_cluster
from tests.unit.test_bench_sparse import FakeLauncher


def test_the_wording_gives_the_count_its_reason_and_the_total() -> None:
    assert planned(10, "5 + a warm-up, × 2 launchers", 4.0) == (
        "10 runs (5 + a warm-up, × 2 launchers) of about 4 s each on 2 cores: about 0:00:40"
    )
    assert planned(1, "", 6.4) == "1 run of about 0:00:06 on 2 cores"


def test_the_hang_bench_counts_its_scenarios_in_words() -> None:
    assert hangs.planned(2, ["starved"], 67.0, 30.0).startswith(
        "2 runs (1 scenario × 2) of about 77 s each: about 0:02:34"
    )
    assert hangs.planned(1, ["prep", "deadlock"], 67.0, 30.0).startswith(
        "2 runs (2 scenarios × 1) of about 58 s each: about 0:01:57"
    )


@pytest.mark.parametrize(
    ("plan", "runs"),
    [
        (lambda: launch_overhead.plan(5), 12),  # a warm-up round, then 5, each launcher
        (lambda: recovery.plan(3), 6),
        (lambda: sparse.plan(2, 100_000, 3), 6),
        (lambda: logs.plan(1_000_000, 20_000, 1000.0, 3), 7),  # a flood, then 3 × 2 loops
        (lambda: parallel.plan(list(parallel.LAYOUTS), 16, 2), 2 * len(parallel.LAYOUTS)),
        (lambda: strategies_bench.plan(400, 3, ("bytes",)), len(strategies_bench.BYTES)),
        (lambda: comm.plan(["allreduce"], Sweep(1 << 10, 16 << 20, 20, 5)), 1),
        (lambda: ps.plan(2, Sweep(64 << 10, 16 << 20, 20, 3)), 1),
    ],
)
def test_each_plan_counts_the_runs_its_bench_makes(plan: Any, runs: int) -> None:
    text = plan()
    assert text.startswith(f"{runs} run{'s' if runs != 1 else ''} "), text
    assert "on 2 cores" in text


def test_every_section_of_the_strategy_bench_counts() -> None:
    every = strategies_bench.plan(400, 3, strategies_bench.SECTIONS)
    assert every.startswith("43 runs (8 throughput + 6 bytes + 11 filters + 18 overlap) ")


def test_a_longer_straggler_run_is_planned_longer() -> None:
    ssgd = [straggler.SCENARIOS["ssgd"]]
    short, long = straggler.plan(ssgd, 60, 0.03, 1), straggler.plan(ssgd, 600, 0.03, 1)
    assert short.startswith("2 runs (1 scenario × 1 × baseline and straggler) of about ")
    assert isinstance(ssgd[0], Scenario) and short != long


def test_the_plan_comes_before_the_first_run_and_never_for_refused_options(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    console = Console(file=out, width=200)
    said_before: list[str] = []
    fake = FakeLauncher(tmp_path)

    def launcher(*args: Any, **kw: Any) -> Any:
        said_before.append(out.getvalue())
        return fake(*args, **kw)

    sparse.run_sparse_bench(
        workers=2, samples=5_000, batch_size=4, repeats=1, console=console,
        cluster=default_cluster(), launcher=launcher,
    )  # fmt: skip
    assert said_before[0].startswith("dmlctl bench sparse: 2 runs (1 × 2 strategies) of about ")
    refused = io.StringIO()
    with pytest.raises(UsageError):
        sparse.run_sparse_bench(
            workers=2, samples=5_000, batch_size=4, repeats=0, console=Console(file=refused),
            cluster=default_cluster(), launcher=launcher,
        )  # fmt: skip
    assert refused.getvalue() == ""


# ------------------------------------------------------------ Ctrl-C: partial results


def stopped_at(run: int, fake: Any) -> Any:
    """A launcher whose ``run``-th run is stopped by Ctrl-C (exit 130), ``fake`` before."""
    calls: list[int] = []

    def launcher(job: Any, cluster: Any, *, options: Any, console: Any) -> Any:
        calls.append(1)
        if len(calls) == run:
            return LaunchResult(f"run{run}", None, None, 130)
        return fake(job, cluster, options=options, console=console)

    return launcher


def test_a_sparse_bench_stopped_in_its_second_repeat_reports_the_first(tmp_path: Path) -> None:
    launcher = stopped_at(4, FakeLauncher(tmp_path))
    with pytest.raises(BenchPartial) as info:
        sparse.run_sparse_bench(
            workers=2, samples=5_000, batch_size=4, repeats=3, console=Console(quiet=True),
            cluster=default_cluster(), launcher=launcher,
        )  # fmt: skip
    assert info.value.note == "interrupted after 3 of 6 runs" and info.value.exit_code == 130
    assert [r.strategy for r in info.value.result] == ["hogwild", "cyclades"]  # whole repeats
    with pytest.raises(BenchInterrupted) as first:  # nothing whole yet: no partial report
        sparse.run_sparse_bench(
            workers=2, samples=5_000, batch_size=4, repeats=3, console=Console(quiet=True),
            cluster=default_cluster(), launcher=stopped_at(2, FakeLauncher(tmp_path / "b")),
        )  # fmt: skip
    assert not isinstance(first.value, BenchPartial)


def test_a_straggler_bench_stopped_in_its_second_scenario_reports_the_first(
    tmp_path: Path,
) -> None:
    from tests.unit.test_bench_straggler import FakeLauncher as RatesLauncher
    from tests.unit.test_bench_straggler import two_slot_cluster

    fake = RatesLauncher(tmp_path, lambda job: {0: 30.0, 1: 30.0, 2: 10.0})
    with pytest.raises(BenchPartial) as info:
        straggler.run_straggler_bench(
            [straggler.SCENARIOS["ssgd"], straggler.SCENARIOS["asgd"]], steps=20,
            step_sleep=0.02, repeats=1, console=Console(quiet=True),
            cluster=two_slot_cluster(), launcher=stopped_at(3, fake),
        )  # fmt: skip
    results, run_ids = info.value.result
    assert [r.scenario.name for r in results] == ["ssgd"] and run_ids == ["run1", "run2"]
    assert info.value.note == "interrupted after 2 of 4 runs"


def test_a_parallel_bench_stopped_in_its_second_round_reports_the_first(tmp_path: Path) -> None:
    from tests.unit.test_bench_parallel import _lines

    def fake(job: Any, cluster: Any, *, options: Any, console: Any) -> LaunchResult:
        run_dir = tmp_path / job.name / str(len(list(tmp_path.glob("*/*"))))
        run_dir.mkdir(parents=True)
        replicas = 4 if job.parallelism is None else 1
        metrics = "\n".join(_lines(10.0, replicas, [1000] * 4, [600] * 4))
        (run_dir / "metrics.jsonl").write_text(metrics, encoding="utf-8")
        return LaunchResult(run_dir.name, run_dir, None, 0)

    with pytest.raises(BenchPartial) as info:
        parallel.run_parallel_bench(
            ["dp4", "tp4"], steps=5, repeats=3, console=Console(quiet=True),
            launcher=stopped_at(4, fake),
        )  # fmt: skip
    report = info.value.result
    assert report["partial"] == "interrupted after 3 of 6 runs"
    assert [len(report["layouts"][n]["run_ids"]) for n in ("dp4", "tp4")] == [1, 1]


def test_the_cli_prints_a_partial_table_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dmlctl.bench.sparse import SparseRun
    from dmlctl.cli.app import main

    def stopped(**kw: Any) -> list[SparseRun]:
        runs = [SparseRun(s, f"run-{s}", 30_000.0, 0.3, 0.86) for s in sparse.STRATEGIES]
        raise BenchPartial("interrupted after 3 of 6 runs", runs)

    monkeypatch.setattr(sparse, "run_sparse_bench", stopped)
    assert main(["bench", "sparse", "--json"]) == 130
    out, err = capsys.readouterr()
    assert json.loads(out)["partial"] == "interrupted after 3 of 6 runs"
    assert "partial results: interrupted after 3 of 6 runs" in err


def test_a_launch_bench_stopped_after_two_timed_rounds_reports_them(tmp_path: Path) -> None:
    calls: list[str] = []

    def timer(argv: Any, env: Any, cwd: Path) -> float:
        calls.append(argv[2])
        if len(calls) == 7:  # the third timed round's dmlctl run
            raise BenchInterrupted("benchmark interrupted: `dmlctl launch` was stopped")
        return 1.0 + len(calls) / 100

    with pytest.raises(BenchPartial) as info:
        launch_overhead.run_launch_bench(
            5, 2, console=Console(quiet=True), home=tmp_path, timer=timer
        )
    report = info.value.result
    assert report["partial"] == "interrupted after 6 of 12 runs" and report["repeats"] == 2
    assert report["dmlctl_s"]["samples"] == [1.03, 1.05]  # the warm-up is never timed
    assert report["torchrun_s"]["samples"] == [1.04, 1.06]


def test_a_recovery_bench_stopped_in_its_second_round_reports_the_first() -> None:
    from tests.unit.test_bench_recovery import recovery as timed

    sides: list[str] = []

    def measure(side: str, work: Path) -> Any:
        sides.append(side)
        if len(sides) == 4:
            raise BenchInterrupted("benchmark interrupted: run r4 was stopped")
        return timed(6.0 if side == "dmlctl" else 5.0)

    with pytest.raises(BenchPartial) as info:
        recovery.run_recovery_bench(3, console=Console(quiet=True), measure=measure)
    assert info.value.note == "interrupted after 3 of 6 runs"
    assert {side: len(r) for side, r in info.value.result.runs.items()} == {
        "dmlctl": 1,
        "torchrun": 1,
    }


STOPPABLE = """\
import signal, sys, time
from pathlib import Path
def stop(*_):
    Path(sys.argv[1]).write_text("stopped as by Ctrl-C")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
Path(sys.argv[1] + ".up").write_text("up")
time.sleep(60)
"""


def test_a_command_under_way_is_stopped_as_ctrl_c_stops_it(tmp_path: Path) -> None:
    """Ctrl-C in the bench's process (here sent by a timer) reaches the command as
    SIGINT, which it may handle, and ends the bench (a real child process)."""
    import os
    import signal
    import sys
    import threading
    import time

    from dmlctl.bench.proc import run_checked

    mark = tmp_path / "mark"

    def ctrl_c_once_up() -> None:
        while not (tmp_path / "mark.up").exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    # as in a terminal: an xdist worker ignores SIGINT, a bench does not
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=ctrl_c_once_up, daemon=True).start()
    argv = [sys.executable, "-c", STOPPABLE, str(mark)]
    try:
        with pytest.raises(BenchInterrupted, match=r"interrupted: `python.*` was stopped"):
            run_checked(argv, {}, tmp_path, timeout=60, error=UsageError)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert mark.read_text() == "stopped as by Ctrl-C"


def test_a_strategy_bench_stopped_in_a_section_reports_the_sections_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def table(self: Any, label: str, rows: Any) -> dict[str, Any]:
        if label == "filters":
            self.done += 2  # two filter runs ended, the third was stopped
            raise BenchInterrupted("benchmark interrupted: `dmlctl launch` was stopped")
        self.done += len(rows)
        return {name: {"bytes_per_step": 1.0} for name in rows}

    monkeypatch.setattr(strategies_bench._Runner, "table", table)
    with pytest.raises(BenchPartial) as info:
        strategies_bench.run_strategy_bench(
            400, 3, console=Console(quiet=True), sections=("bytes", "filters")
        )
    report = info.value.result
    assert report["sections"] == ["bytes"] and "filters" not in report
    assert set(report["bytes"]) == set(strategies_bench.BYTES)
    assert report["partial"] == f"interrupted after {len(strategies_bench.BYTES) + 2} of 17 runs"
