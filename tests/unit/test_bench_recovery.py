"""Pure tests of the recovery benchmark: timing files, recovery and stage arithmetic,
torchrun's log times, the run directory's times, the report, its tables and the loop."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from dmlctl.bench.recovery import (
    CHECKPOINT_EVERY,
    JOB_DIR,
    KILL_AT,
    SCRIPT,
    RecoveryReport,
    bench_cluster,
    recovery_job,
    run_recovery_bench,
    torchrun_command,
)
from dmlctl.bench.recovery_tables import render_recovery_tables
from dmlctl.bench.recovery_timing import (
    STAGES,
    Recovery,
    RecoveryBenchFailed,
    TimingRecord,
    dmlctl_times,
    measure_recovery,
    parse_timing,
    read_timing_dir,
    torchrun_times,
)
from dmlctl.errors import UsageError
from dmlctl.launch.api import plan_run
from dmlctl.runs.store import RunStore

KILL = 1000.0


def timing_lines(rank: int, *, killed: bool) -> list[str]:
    """A rank's timing file as the script writes it: 12 steps, a kill (rank 1), then
    attempt 1 resuming from step 10 and doing steps 11-13."""
    lines = [f"start -1 {KILL - 5:.6f} 0", f"resumed_from 0 {KILL - 2:.6f} 0"]
    lines += [f"step {s} {KILL - 0.6 + 0.05 * s:.6f} 0" for s in range(1, 13)]
    if killed:
        lines.append(f"kill 12 {KILL:.6f} 0")
    restart = {"start": 0.7, "imported": 2.0, "joined": 2.1, "built": 3.5, "resumed_from": 3.6}
    for kind, after in restart.items():
        lines.append(f"{kind} {10 if kind == 'resumed_from' else -1} {KILL + after:.6f} 1")
    lines += [f"step {s} {KILL + 3.6 + 0.05 * (s - 10):.6f} 1" for s in range(11, 14)]
    return lines


def all_records() -> list[TimingRecord]:
    return parse_timing(timing_lines(0, killed=False), 0) + parse_timing(
        timing_lines(1, killed=True), 1
    )


def recovery(seconds: float, *, lost: int = 2, **stages: float) -> Recovery:
    return Recovery(KILL, KILL + seconds, 10 + lost, 10, {**stages, "first_step": seconds})


def test_parse_timing_reads_lines_and_skips_blank_torn_and_junk_lines() -> None:
    lines = [
        "step 3 12.5 0",
        "",
        "resumed_from 10 13.25 1\n",
        "step 4 12.",
        "kill x 1 0",
        "a b c d e",
        "step 4 12.75 0.5",
        "kill 12 14.0 0",
    ]
    assert parse_timing(lines, 1) == [
        TimingRecord(1, "step", 3, 12.5, 0),
        TimingRecord(1, "resumed_from", 10, 13.25, 1),
        TimingRecord(1, "kill", 12, 14.0, 0),
    ]


def test_read_timing_dir_reads_every_rank_file_and_ignores_others(tmp_path: Path) -> None:
    (tmp_path / "rank-0.timing").write_text("step 1 1.0 0\n")
    (tmp_path / "rank-1.timing").write_text("step 1 1.5 0\nkill 1 1.6 0\n")
    (tmp_path / "rank-x.timing").write_text("step 1 9.0 0\n")
    (tmp_path / "notes.txt").write_text("step 1 9.0 0\n")
    records = read_timing_dir(tmp_path)
    assert [(r.rank, r.kind, r.time) for r in records] == [
        (0, "step", 1.0),
        (1, "step", 1.5),
        (1, "kill", 1.6),
    ]
    assert read_timing_dir(tmp_path / "missing") == []


def test_measure_recovery_from_kill_to_the_killed_ranks_first_step_after_restart() -> None:
    rec = measure_recovery(all_records(), launcher_times={"detected": KILL + 0.1})
    assert rec.kill_time == KILL
    assert rec.seconds == pytest.approx(3.65)  # step 11 of attempt 1
    assert (rec.steps_done, rec.resumed_from, rec.steps_lost) == (12, 10, 2)
    assert rec.steps_lost <= CHECKPOINT_EVERY
    assert list(rec.stages) == [
        "detected",
        "script_started",
        "torch_imported",
        "joined",
        "built",
        "resumed",
        "first_step",
    ]
    expected = [0.1, 0.7, 2.0, 2.1, 3.5, 3.6, 3.65]
    assert list(rec.stages.values()) == pytest.approx(expected)
    assert rec.to_dict()["recovery_s"] == pytest.approx(3.65)
    assert rec.to_dict()["steps_lost"] == 2 and rec.to_dict()["cause"] == ""


def test_steps_done_counts_the_furthest_rank_before_the_kill() -> None:
    ahead = TimingRecord(0, "step", 13, KILL + 0.01, 0)  # a peer one step further
    assert measure_recovery([*all_records(), ahead]).steps_lost == 3


def test_launcher_times_outside_the_known_stages_are_ignored() -> None:
    rec = measure_recovery(all_records(), launcher_times={"bogus": KILL + 1})
    assert "bogus" not in rec.stages


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        (lambda r: r.kind == "kill", "rank 1 recorded no kill"),
        (lambda r: r.kind == "step" and r.attempt == 1, "completed no step after the restart"),
        (lambda r: r.kind == "resumed_from" and r.attempt == 1, "where attempt 1 resumed from"),
    ],
)
def test_measure_recovery_names_what_is_missing(
    drop: Callable[[TimingRecord], bool], message: str
) -> None:
    with pytest.raises(RecoveryBenchFailed, match=message):
        measure_recovery([r for r in all_records() if not drop(r)])


def glog(stamp: time.struct_time, micros: int, text: str, level: str = "W") -> str:
    return f"{level}{time.strftime('%m%d %H:%M:%S', stamp)}.{micros:06d} 4242 api.py:1] {text}"


def test_torchrun_times_reads_the_first_detection_and_failure_lines() -> None:
    base = time.mktime((2026, 11, 21, 0, 45, 25, 0, 0, -1))
    stamp = time.localtime(base)
    lines = [
        "some worker output mentioning closing signal",  # no log prefix: ignored
        glog(stamp, 886000, "Sending process 24970 closing signal SIGTERM"),
        glog(stamp, 894000, "failed (exitcode: -9) local_rank: 1 (pid: 24971)", "E"),
        glog(stamp, 999000, "Sending process 1 closing signal SIGTERM"),  # later: ignored
    ]
    got = torchrun_times(lines, now=base + 60)
    assert got == pytest.approx({"detected": base + 0.886, "workers_stopped": base + 0.894})


def test_torchrun_log_times_take_the_year_nearest_to_now() -> None:
    new_year = time.mktime((2027, 1, 1, 0, 0, 1, 0, 0, -1))
    line = glog(time.localtime(new_year), 0, "failed (exitcode: -9)", "E")
    just_before = new_year - 30  # 31 December 2026: the log line is from 2027
    assert torchrun_times([line], now=just_before) == {"workers_stopped": new_year}
    assert torchrun_times([], now=just_before) == {}


def test_dmlctl_times_read_the_run_directory(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "home")
    plan = plan_run(recovery_job(tmp_path, 0.1), bench_cluster(), store, port=29500)
    run = store.create(plan.run_id)
    run.write_plan(plan.to_dict(), {})
    failure = {
        **{"host": "local", "rank": 1, "exc_type": "Signal", "message": "killed by SIGKILL"},
        **{"traceback": [], "ts": KILL + 0.5, "kind": "killed from outside", "evidence": "exit"},
    }
    run.write_json(run.state_file, {"failures": [failure]})
    host = plan.hosts[0]
    attempt_dir = Path(host.rank_dir) / "attempt-1"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "agent.pid").write_text("123\n")
    start = {"kind": "start", "rank": 1, "local_rank": 1, "pid": 7, "role": "worker", "ts": 1.5}
    (attempt_dir / "rank-1.events.jsonl").write_text(json.dumps(start) + "\n{torn")
    now = math.floor(time.time())
    line = glog(time.localtime(now), 100000, "closing signal SIGTERM")
    (run.logs / "agent-local.log").write_text(line + "\n")
    got = dmlctl_times(run.path)
    assert got["controller_notified"] == KILL + 0.5
    assert got["rank_started"] == 1.5
    assert got["agent_started"] == pytest.approx((attempt_dir / "agent.pid").stat().st_mtime)
    assert got["detected"] == pytest.approx(now + 0.1)
    # torchrun's summary may blame the peer (exit code 1): still the controller's clock.
    peer = {**failure, "exc_type": "ExitCode", "kind": "user code"}
    run.write_json(run.state_file, {"failures": [peer]})
    assert dmlctl_times(run.path)["controller_notified"] == KILL + 0.5
    # A cause taken from a rank's own exit record carries the rank's clock: no stage.
    own = {**failure, "exc_type": "RuntimeError", "kind": "user code", "evidence": "record"}
    run.write_json(run.state_file, {"failures": [own]})
    assert "controller_notified" not in dmlctl_times(run.path)
    assert dmlctl_times(tmp_path / "nothing") == {}


def test_report_medians_ratio_steps_lost_and_stages() -> None:
    report = RecoveryReport(
        {
            "dmlctl": (recovery(6.0, detected=0.1), recovery(5.0, lost=3), recovery(9.0)),
            "torchrun": (recovery(4.0, detected=0.2), recovery(5.0, detected=0.4)),
        },
        backoff_s=0.1,
    )
    assert report.median("dmlctl") == pytest.approx(6.0)
    assert report.median("torchrun") == pytest.approx(4.5)
    assert report.ratio == pytest.approx(6.0 / 4.5)
    assert (report.steps_lost("dmlctl"), report.steps_lost("torchrun")) == (3, 2)
    # A stage counts over the runs that saw it.
    assert report.stages("dmlctl") == pytest.approx({"detected": 0.1, "first_step": 6.0})
    assert report.stages("torchrun") == pytest.approx({"detected": 0.3, "first_step": 4.5})
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ratio"] == pytest.approx(6.0 / 4.5) and data["ratio_goal"] == 1.2
    assert data["repeats"] == 3 and data["backoff_s"] == 0.1 and data["default_backoff_s"] == 1.0
    assert data["dmlctl"]["recovery_s"]["samples"] == [6.0, 5.0, 9.0]
    assert data["dmlctl"]["recovery_s"]["median"] == 6.0
    assert data["dmlctl"]["steps_lost"] == 3 and len(data["torchrun"]["runs"]) == 2
    assert data["checkpoint_every"] == CHECKPOINT_EVERY and data["kill_at"] == KILL_AT


def test_tables_show_seconds_ratio_goals_and_stages() -> None:
    report = RecoveryReport(
        {"dmlctl": (recovery(6.0, agent_started=0.8),), "torchrun": (recovery(5.0),)},
        backoff_s=0.1,
    )
    console = Console(file=io.StringIO(), width=120, color_system=None, highlight=False)
    for table in render_recovery_tables(report):
        console.print(table)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    ratio_row = next(line for line in out.splitlines() if "dmlctl/torchrun" in line)
    assert [c.strip() for c in ratio_row.split("│")] == [
        "dmlctl/torchrun",
        "1.200",
        "goal ≤ 1.2",
        "",
        f"goal ≤ {CHECKPOINT_EVERY}",
    ]
    dml_row = next(line for line in out.splitlines() if line.startswith("dmlctl "))
    assert [c.strip() for c in dml_row.split("│")] == ["dmlctl", "6.000", "6.000", "6.000", "2"]
    agent_row = next(line for line in out.splitlines() if "new host agent" in line)
    assert [c.strip() for c in agent_row.split("│")][1:] == ["0.800", ""]
    assert "backoff 0.1 s" in out
    assert "torchrun saw the kill" not in out  # a stage nobody saw has no row


def test_bench_alternates_sides_in_fresh_directories() -> None:
    calls: list[tuple[str, Path]] = []

    def measure(side: str, work: Path) -> Recovery:
        assert work.is_dir() and not any(work.iterdir())
        calls.append((side, work))
        return recovery(6.0 if side == "dmlctl" else 5.0)

    report = run_recovery_bench(2, console=Console(file=io.StringIO()), measure=measure)
    assert [side for side, _ in calls] == ["dmlctl", "torchrun", "dmlctl", "torchrun"]
    assert len({work for _, work in calls}) == 4
    assert report.ratio == pytest.approx(1.2) and report.backoff_s == 0.1


@pytest.mark.parametrize(
    ("repeats", "backoff", "message"),
    [(0, 0.1, "--repeats must be at least 1"), (1, 0.0, "--backoff"), (1, math.nan, "--backoff")],
)
def test_bench_rejects_bad_options(repeats: int, backoff: float, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        run_recovery_bench(repeats, backoff=backoff, console=Console(file=io.StringIO()))


def test_both_sides_run_the_same_shipped_script(tmp_path: Path) -> None:
    assert (JOB_DIR / SCRIPT).is_file()
    job = recovery_job(tmp_path, 0.25)
    assert (job.workdir, job.script, job.workers) == (str(JOB_DIR), SCRIPT, 2)
    assert job.checkpoint is None  # the script's own checkpoints, on both sides
    assert (job.restart.max_infra_restarts, job.restart.backoff_initial) == (1, 0.25)
    assert job.restart.max_user_restarts == 1  # like torchrun's --max-restarts 1
    assert recovery_job(tmp_path, 60.0).restart.backoff_max == 60.0  # never capped below it
    argv = torchrun_command(tmp_path)
    assert argv[1:8] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
    ]
    assert argv[8] == str(JOB_DIR / SCRIPT) and argv[9:] == job.args
    assert job.args[job.args.index("--kill-at") + 1] == str(KILL_AT)


def test_stage_keys_are_unique() -> None:
    keys = [key for key, _ in STAGES]
    assert len(keys) == len(set(keys)) and keys[-1] == "first_step"


# ----------------------------------------------------------------- --mode in_place


def in_place_records(after_s: float = 0.1) -> list[TimingRecord]:
    """Rank 0 steps every 0.1 s from KILL - 10 on, every ``after_s`` after the kill,
    for 10 s; rank 1 is killed after its step 12 and its replacement (attempt 1) goes
    on from 12 at KILL + 0.2."""
    survivor = [f"step {s} {KILL - 10 + 0.1 * s:.6f} 0" for s in range(1, 101)]
    survivor += [f"step {100 + s} {KILL + after_s * s:.6f} 0" for s in range(1, int(10 / after_s))]
    killed = [f"step {s} {KILL - 1.2 + 0.1 * s:.6f} 0" for s in range(1, 13)]
    killed += [f"kill 12 {KILL:.6f} 0", f"start -1 {KILL + 0.05:.6f} 1"]
    killed += [f"resumed_from 12 {KILL + 0.1:.6f} 1", f"step 13 {KILL + 0.2:.6f} 1"]
    return parse_timing(survivor, 0) + parse_timing(killed, 1)


def test_in_place_counts_the_killed_ranks_steps_and_the_survivors_rate() -> None:
    from dmlctl.bench.recovery_timing import survivor_rate

    found = measure_recovery(in_place_records(), in_place=True)
    assert found.seconds == pytest.approx(0.2)
    assert (found.steps_done, found.resumed_from, found.steps_lost) == (12, 12, 0)
    joined = dataclasses.replace(found, resumed_from=16)  # at its peers' round: 4 unseen
    assert (joined.steps_lost, joined.to_dict()["steps_skipped"]) == (0, 4)
    assert found.survivor_rate == pytest.approx(1.0, rel=0.02)
    assert found.to_dict()["survivor_rate"] == found.survivor_rate
    assert measure_recovery(in_place_records(0.2), in_place=True).survivor_rate == (
        pytest.approx(0.5, rel=0.03)
    )
    full = measure_recovery(in_place_records())  # the furthest rank, as after a restart
    assert full.steps_done == 199 and full.survivor_rate is None
    records = in_place_records()
    kill = next(r for r in records if r.kind == "kill")
    assert survivor_rate([r for r in records if r.time <= KILL or r.rank == 1], kill) is None


def test_the_in_place_side_is_reported_against_torchrun() -> None:
    from dmlctl.bench.recovery import IN_PLACE

    rates = (0.9, 0.85, None)
    in_place = tuple(
        dataclasses.replace(recovery(s, lost=0), survivor_rate=r)
        for s, r in zip((0.3, 0.2, 0.5), rates, strict=True)
    )
    report = RecoveryReport(
        {"dmlctl": (recovery(3.0),), "torchrun": (recovery(4.0),), IN_PLACE: in_place},
        backoff_s=0.1,
        ranks_start="warm",
    )
    assert report.in_place_ratio == pytest.approx(0.3 / 4.0)
    assert report.survivor_rate == pytest.approx(0.875)  # over the runs that measured one
    data = json.loads(json.dumps(report.to_dict()))
    assert (data["mode"], data["in_place_ratio_goal"], data["survivor_rate_goal"]) == (
        "in_place",
        0.3,
        0.8,
    )
    assert data[IN_PLACE]["steps_lost"] == 0 and len(data[IN_PLACE]["runs"]) == 3
    console = Console(file=io.StringIO(), width=120, color_system=None, highlight=False)
    for table in render_recovery_tables(report):
        console.print(table)
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    row = next(line for line in lines if "in_place/torchrun" in line)
    assert [c.strip() for c in row.split("│")] == [
        "in_place/torchrun",
        "0.075",
        "goal ≤ 0.3",
        "",
        "goal 0",
    ]
    rate = next(line for line in lines if "survivor steps/s" in line)
    assert [c.strip() for c in rate.split("│")][1:3] == ["0.875", "goal ≥ 0.8"]
    assert any(line.startswith("dmlctl in_place ") for line in lines)
    assert any("ranks warm" in line for line in lines)
    fresh = dataclasses.replace(report, ranks_start="fresh")
    assert (fresh.in_place_goal, fresh.to_dict()["ranks_start"]) == (0.5, "fresh")
    without = RecoveryReport({"dmlctl": (recovery(3.0),), "torchrun": (recovery(4.0),)}, 0.1)
    assert without.in_place_ratio is None and without.to_dict()["mode"] == "full"


def test_mode_in_place_alternates_three_sides() -> None:
    from dmlctl.bench.recovery import plan

    calls: list[str] = []

    def measure(side: str, work: Path) -> Recovery:
        calls.append(side)
        return recovery(0.2 if side == "in_place" else 4.0)

    quiet = Console(file=io.StringIO())
    report = run_recovery_bench(
        1, mode="in_place", strategy="local-sgd", console=quiet, measure=measure
    )
    assert calls == ["dmlctl", "torchrun", "in_place"]
    assert report.to_dict()["in_place_strategy"] == "local-sgd"
    assert report.in_place_ratio == pytest.approx(0.05)
    assert plan(2, "in_place").startswith("6 runs (2 × 3 launchers)")
    with pytest.raises(UsageError, match="--mode must be one of full, in_place"):
        run_recovery_bench(1, mode="partial", console=quiet, measure=measure)


def test_the_in_place_job_is_a_valid_parameter_server_job(tmp_path: Path) -> None:
    from dmlctl.bench import recovery_in_place as ip

    assert (ip.JOB_DIR / ip.SCRIPT).is_file()
    job = ip.in_place_job(tmp_path)
    assert (job.strategy.name, job.workers, job.parameter_servers) == ("asgd", 2, 1)
    assert job.restart.mode == "in_place" and job.checkpoint is None
    assert job.args[job.args.index("--kill-at") + 1] == str(ip.KILL_AT)
    assert sum(h.slots for h in ip.in_place_cluster().hosts) == 3
    averaging = ip.in_place_job(tmp_path, "local-sgd")  # no servers to place
    assert (averaging.strategy.name, averaging.parameter_servers) == ("local-sgd", 0)


def test_dmlctl_sides_run_on_a_cluster_file_and_the_report_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--cluster FILE``: dmlctl's runs go there (its hosts named in the title); a file
    that is not one is refused, a line per problem, exit 2, before any run."""
    from dmlctl.bench import recovery as bench
    from dmlctl.cli.app import main

    cluster = tmp_path / "lab.yaml"
    cluster.write_text(
        "hosts:\n- {name: a, address: 10.0.0.2, slots: 1}\n"
        "- {name: b, address: 10.0.0.3, slots: 1}\n"
    )
    got: list[object] = []

    def fake(*_args: object, cluster: object = None, **_kw: object) -> RecoveryReport:
        got.append(cluster)
        return RecoveryReport(
            {"dmlctl": (recovery(3.0),), "torchrun": (recovery(4.0),)}, 0.1, hosts="2 hosts"
        )

    monkeypatch.setattr(bench, "run_recovery_bench", fake)
    assert main(["bench", "recovery", "--cluster", str(cluster)]) == 0
    (spec,) = got
    assert [h.name for h in spec.hosts] == ["a", "b"]  # type: ignore[attr-defined]
    out = " ".join(capsys.readouterr().out.split())  # the title may wrap
    assert "dmlctl backoff 0.1 s, ranks fresh, dmlctl on 2 hosts" in out
    cluster.write_text("hosts:\n- {name: a, adress: 10.0.0.2}\n")
    assert main(["bench", "recovery", "--cluster", str(cluster)]) == 2
    err = capsys.readouterr().err.strip()
    assert all("lab.yaml:2 hosts[0]." in line for line in err.splitlines()), err
    assert "unknown key 'adress'; did you mean 'address'?" in err, err
