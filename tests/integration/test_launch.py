"""End to end on this machine: the real CLI, host agent, torchrun and gloo ranks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dmlctl.spec.loader import load_job
from tests.conftest import REPO, Cli
from tests.integration.conftest import JOBS, FinishedRuns
from tests.integration.procs import agent_pid, alive, cmdline, run_processes, wait_until

pytestmark = pytest.mark.integration


def only_run(cli: Cli) -> str:
    runs = cli.runs()
    assert len(runs) == 1, runs
    return runs[0].name


def test_failing_rank_is_reported_with_root_cause(finished_runs: FinishedRuns) -> None:
    cli, (run_id, proc) = finished_runs.cli, finished_runs.failed
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rank 1 on local: ValueError: bad batch at step 3" in proc.stdout
    assert 'raise ValueError("bad batch at step 3")' in proc.stdout
    # torchrun's own report of it is kept in the logs, not printed a second time
    for torchruns in ("Root Cause (first observed failure)", "ChildFailedError"):
        assert torchruns not in proc.stdout, proc.stdout
    agent_log = cli.home / "runs" / run_id / "logs" / "agent-local.log"
    assert "Root Cause (first observed failure)" in agent_log.read_text()
    state = cli.state(run_id)
    assert state["phase"] == "failed"
    assert state["exit_code"] == 1
    cause = state["root_cause"]
    assert (cause["rank"], cause["host"], cause["exc_type"]) == (1, "local", "ValueError")
    assert cause["message"] == "bad batch at step 3"
    assert any("train.py" in line for line in cause["traceback"])
    statuses = {r["rank"]: r["status"] for r in state["ranks"]}
    assert statuses == {0: "stopped", 1: "failed"}
    assert not run_processes(run_id)
    # torchrun's log directory is the run's (not a new torchelastic_* in $TMPDIR)
    torchrun = cli.home / "runs" / run_id / "hosts" / "local" / "torchrun"
    assert list(torchrun.glob("*/attempt_0/1/error.json")), sorted(torchrun.rglob("*"))


def test_plain_torchrun_script_runs_unchanged(finished_runs: FinishedRuns) -> None:
    cli, (run_id, proc) = finished_runs.cli, finished_runs.succeeded
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = cli.home / "runs" / run_id / "logs"
    for rank in (0, 1):
        text = (logs / f"rank-{rank}.log").read_text()
        assert f"plain rank={rank} sum=3 RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2" in text
        assert "LOCAL_WORLD_SIZE=2 MASTER_ADDR=" in text and "MASTER_PORT=" in text
    assert cli.state(run_id)["phase"] == "succeeded"


def test_every_log_line_is_kept_when_the_terminals_reader_goes_away(cli: Cli) -> None:
    """``dmlctl launch job.yaml --ui plain | head -3``: the view's reader leaves after 3
    lines, the run goes on and ends as it would have, every line in its logs."""
    lines = 25000
    proc = cli.popen("launch", str(JOBS / "chatty" / "job.yaml"), "--ui", "plain")
    assert proc.stdout is not None
    first = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()  # as `head -3` does
    assert proc.wait(timeout=120) == 0, first
    run_id = only_run(cli)
    assert cli.state(run_id)["phase"] == "succeeded"
    logs = cli.home / "runs" / run_id / "logs"
    for rank in (0, 1):
        got = (logs / f"rank-{rank}.log").read_text().splitlines()
        assert sorted(got, key=lambda s: int(s.rsplit(" ", 1)[1])) == [
            f"r{rank} line {i}" for i in range(lines)
        ]
    merged = (logs / "merged.log").read_text().splitlines()
    assert sum(1 for line in merged if line.startswith("[rank ")) == 2 * lines
    reader = subprocess.Popen(  # `dmlctl logs RUN | head -1`: it ends quietly
        [sys.executable, "-m", "dmlctl", "logs", run_id],
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stdout.readline()
    reader.stdout.close()
    assert reader.wait(timeout=60) == 0
    assert reader.stderr is not None and reader.stderr.read() == b""


def test_control_characters_a_rank_prints_reach_the_terminal_escaped(cli: Cli) -> None:
    """An OSC title, a C1 CSI, a NUL and a clear-screen from a rank: ``--ui plain``
    shows the first three escaped and drops the CSI; the log file keeps every byte."""
    proc = cli.run("launch", str(JOBS / "controls" / "job.yaml"), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] title \\x1b]0;owned\\x07 c1 \\x9b2J nul \\x00 end" in proc.stdout
    assert "[rank 0] red and  clear" in proc.stdout
    assert not any(c in proc.stdout for c in ("\x00", "\x07", "\x9b", "\x1b")), proc.stdout
    # the ending is said once: the summary's line, not a printer's line before it too
    endings = [ln for ln in proc.stdout.splitlines() if " succeeded" in ln and "run " in ln]
    assert len(endings) == 1 and endings[0].startswith("run "), proc.stdout
    log = cli.home / "runs" / only_run(cli) / "logs" / "rank-0.log"
    assert log.read_text().splitlines() == [
        "title \x1b]0;owned\x07 c1 \x9b2J nul \x00 end",
        "\x1b[31mred\x1b[0m and \x1b[2J clear",
    ]


def test_dry_run_prints_plan_and_starts_nothing(cli: Cli) -> None:
    proc = cli.run("launch", str(JOBS / "plain" / "job.yaml"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "-m dmlctl.agent.torchrun" in proc.stdout
    assert "--rdzv-backend dmlctl" in proc.stdout
    assert "host local" in proc.stdout
    assert cli.runs() == []


def _wait_running(cli: Cli, timeout: float = 60) -> str:
    assert wait_until(
        lambda: (
            cli.runs()
            and all(r["status"] == "running" for r in cli.state(cli.runs()[0].name)["ranks"])
        ),
        timeout,
    ), "ranks never started"
    return cli.runs()[0].name


def test_detach_then_stop_leaves_no_process(cli: Cli) -> None:
    proc = cli.run("launch", str(JOBS / "forever" / "job.yaml"), "--detach")
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    assert f"dmlctl attach {run_id}" in proc.stderr, proc.stderr  # how to watch it
    assert run_id == _wait_running(cli)
    assert run_processes(run_id), "nothing of the run is running"
    status = cli.run("status", run_id, "--json")
    assert json.loads(status.stdout)["phase"] == "running"
    started = time.monotonic()
    stop = cli.run("stop", run_id)
    assert stop.returncode == 0, stop.stderr
    assert "stopped" in stop.stdout
    assert time.monotonic() - started < 10
    assert wait_until(lambda: not run_processes(run_id), 5), run_processes(run_id)
    state = cli.state(run_id)
    assert (state["phase"], state["exit_code"]) == ("stopped", 130)


def test_ctrl_c_stops_a_foreground_run(cli: Cli) -> None:
    proc = cli.popen("launch", str(JOBS / "forever" / "job.yaml"), "--ui", "plain")
    try:
        run_id = _wait_running(cli)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        assert proc.wait(15) == 130
        assert wait_until(lambda: not run_processes(run_id), 5), run_processes(run_id)
        assert cli.state(run_id)["phase"] == "stopped"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_killed_controller_leaves_no_orphans(cli: Cli) -> None:
    proc = cli.popen("launch", str(JOBS / "forever" / "job.yaml"), "--ui", "quiet")
    run_id = _wait_running(cli)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)
    state = json.loads(cli.run("status", run_id, "--json").stdout)
    assert state["phase"] == "lost"


@pytest.mark.skipif(not (REPO / "examples/quickstart/job.yaml").exists(), reason="no example")
def test_quickstart_learns_on_two_workers(cli: Cli, tmp_path: Path) -> None:
    job_dir = tmp_path / "quickstart"
    shutil.copytree(REPO / "examples" / "quickstart", job_dir)
    proc = cli.run("launch", str(job_dir / "job.yaml"), "--workers", "2", "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = only_run(cli)
    run = cli.home / "runs" / run_id
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in records} == {0, 1}
    for rank in (0, 1):
        mine = [r["values"] for r in records if r["rank"] == rank]
        losses = [v["loss"] for v in mine if "loss" in v]
        assert len(losses) >= 3
        assert losses[-1] < 0.5 * losses[0], losses
        assert (run / "logs" / f"rank-{rank}.log").read_text().strip()
    status = json.loads(cli.run("status", run_id, "--json").stdout)
    assert status["phase"] == "succeeded"
    assert status["exit_code"] == 0
    assert all(r["status"] == "succeeded" for r in status["ranks"])
    assert not run_processes(run_id)


def test_status_lists_runs_as_json(finished_runs: FinishedRuns) -> None:
    cli, (run_id, proc) = finished_runs.cli, finished_runs.succeeded
    assert proc.returncode == 0
    listing = json.loads(cli.run("status", "--json").stdout)
    phases = {s["run_id"]: s["phase"] for s in listing}
    assert phases == {
        run_id: "succeeded",
        finished_runs.failed.run_id: "failed",
        finished_runs.crashed.run_id: "failed",
    }
    # --ui quiet: the run id first, the outcome last, no rank lines or table.
    out = proc.stdout.splitlines()
    assert out[0] == f"run {run_id}", proc.stdout
    assert f"run {run_id} succeeded in" in proc.stdout and "exit code 0" in proc.stdout
    assert "[rank " not in proc.stdout and "samples/s" not in proc.stdout
    assert out[-1].startswith("logs: "), proc.stdout
    text = cli.run("status").stdout
    assert all(run in text for run in phases)


def test_logs_command_prints_rank_lines(finished_runs: FinishedRuns, tmp_path: Path) -> None:
    run_id = finished_runs.succeeded.run_id
    cli = finished_runs.copy_home(tmp_path / "home")  # this test empties a rank's log
    one = cli.run("logs", run_id, "--rank", "1")
    assert one.returncode == 0
    assert "plain rank=1" in one.stdout and "plain rank=0" not in one.stdout
    merged = cli.run("logs", run_id[:12], "--follow")
    assert "[rank 0] plain rank=0" in merged.stdout and "[rank 1] plain rank=1" in merged.stdout
    bad = cli.run("logs", run_id, "--rank", "7")
    assert bad.returncode == 2 and "no rank 7" in bad.stderr
    (cli.home / "runs" / run_id / "logs" / "rank-1.log").write_bytes(b"")  # a silent rank
    silent = cli.run("logs", run_id, "--rank", "1")
    assert silent.returncode == 0 and silent.stdout == ""
    assert f"rank 1 of run {run_id} wrote nothing" in silent.stderr


def test_init_project_launches_as_is(cli: Cli, tmp_path: Path) -> None:
    assert cli.run("init", "myproj", cwd=tmp_path).returncode == 0
    proc = cli.run("launch", "job.yaml", "--ui", "plain", cwd=tmp_path / "myproj")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = only_run(cli)
    assert run_id.startswith("myproj-")  # the job is named after its project
    records = [
        json.loads(line)
        for line in (cli.home / "runs" / run_id / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [r["values"]["loss"] for r in records if r["rank"] == 0 and "loss" in r["values"]]
    assert losses[-1] < losses[0]
    assert cli.state(run_id)["phase"] == "succeeded"


def test_rank_killed_by_a_signal_is_the_root_cause(finished_runs: FinishedRuns) -> None:
    cli, (run_id, proc) = finished_runs.cli, finished_runs.crashed
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cause = cli.state(run_id)["root_cause"]
    assert (cause["rank"], cause["exc_type"]) == (1, "Signal")
    assert cause["message"] == "killed by SIGSEGV"
    assert cause["traceback"] == ["native code is about to crash"]
    assert "rank 1 on local: Signal: killed by SIGSEGV" in proc.stdout
    assert not run_processes(run_id)


STRATEGY_EXAMPLES = sorted(p.name for p in (REPO / "examples" / "strategies").glob("*.yaml"))
#: One real launch per family of the examples: gradients all-reduced every step (ssgd with
#: a compression hook) and models averaged every few steps. That each example learns is
#: checked on warm ranks, with its own strategy and parameters
#: (tests/strategies/test_examples.py).
LAUNCHED_EXAMPLES = ["ssgd-powersgd.yaml", "bmuf.yaml"]


@pytest.mark.parametrize("job", STRATEGY_EXAMPLES)
def test_every_strategy_example_plans(cli: Cli, job: str) -> None:
    """Each example validates and plans as the job file says (its strategy, workers and
    every parameter it sets), and a dry run starts nothing."""
    path = REPO / "examples" / "strategies" / job
    spec = load_job(path)
    proc = cli.run("launch", str(path), "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"strategy {spec.strategy.name}, {spec.workers} workers" in proc.stdout, proc.stdout
    assert f"DMLCTL_STRATEGY={spec.strategy.name}\n" in proc.stdout, proc.stdout
    params = next(line for line in proc.stdout.splitlines() if line.startswith("strategy params"))
    for key, value in spec.strategy.params.model_dump(exclude_unset=True).items():
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        assert f"{key}={shown}" in params, (key, value, params)
    assert "-m dmlctl.agent.torchrun" in proc.stdout and str(spec.script) in proc.stdout
    assert cli.runs() == []


@pytest.mark.parametrize("job", LAUNCHED_EXAMPLES)
def test_a_strategy_example_of_each_family_trains(cli: Cli, job: str) -> None:
    proc = cli.run("launch", str(REPO / "examples" / "strategies" / job), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    accuracy = float(proc.stdout.split("final accuracy: ")[1].split()[0])
    assert accuracy > 0.8, accuracy
    run_id = only_run(cli)
    records = [
        json.loads(line)
        for line in (cli.home / "runs" / run_id / "metrics.jsonl").read_text().splitlines()
    ]
    assert any("comm_bytes_per_step" in r["values"] for r in records)


@pytest.mark.compat
def test_a_transient_failure_is_restarted(cli: Cli) -> None:
    proc = cli.run("launch", str(JOBS / "flaky" / "job.yaml"), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = cli.state(only_run(cli))
    causes = [f"{f['exc_type']}: {f['message']}" for f in state["failures"]]
    assert (state["phase"], state["restarts"]) == ("succeeded", 1), (causes, proc.stdout)
    assert state["failures"][0]["message"] == "transient failure on the first attempt"
    assert "rank 1 finished on attempt 2" in proc.stdout
    # No checkpoint: block: said once before the run, and again at its restart.
    said = (proc.stderr + proc.stdout).splitlines()  # at launch, then with the restart
    notes = [line for line in said if "no checkpoint: block in the job" in line]
    assert len(notes) == 2 and "the steps done are lost" in notes[1], notes
    assert not run_processes(state["run_id"])


def test_a_failure_on_every_attempt_stops_after_the_user_budget(cli: Cli) -> None:
    proc = cli.run("launch", str(JOBS / "alwaysfail" / "job.yaml"), "--ui", "plain")
    assert proc.returncode == 1
    state = cli.state(only_run(cli))
    causes = [(f["kind"], f["exc_type"], f["message"]) for f in state["failures"]]
    user = [c for c in causes if c[0] == "user code"]
    # The user budget is spent exactly; a failure of the machine (a rank killed, a hang
    # on a loaded machine) spends the infrastructure budget and is never the script's.
    assert state["phase"] == "failed" and len(user) == 2, (causes, proc.stdout)
    assert all(c[1] != "RuntimeError" for c in causes if c[0] != "user code"), causes
    assert state["restarts"] == len(causes), (state["restarts"], causes)
    assert state["root_cause"]["exc_type"] == "RuntimeError"
    assert "RuntimeError: transient failure" in proc.stdout


def test_a_stopped_rank_is_detected_as_hung_and_restarted(cli: Cli) -> None:
    started = time.monotonic()
    proc = cli.run("launch", str(JOBS / "stopped" / "job.yaml"), "--ui", "plain")
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = cli.state(only_run(cli))
    assert (state["phase"], state["restarts"]) == ("succeeded", 1)
    hang = state["failures"][0]
    assert (hang["rank"], hang["exc_type"]) == (1, "Hang")
    assert hang["message"].startswith("not responding: sent no heartbeat for "), hang
    assert took < 60, took  # hang_timeout 4 s, never a 30-minute collective timeout
    assert not run_processes(state["run_id"])


HOST_TIMEOUT = 1.0


def test_a_local_agent_that_falls_silent_but_lives_is_not_lost(cli: Cli, tmp_path: Path) -> None:
    """A loaded machine can keep the local agent from running for longer than
    host_timeout (here: SIGSTOP for three times it): its process lives, so the host is
    not lost and the run ends as it would have."""
    job = tmp_path / "job.yaml"
    job.write_text(
        f"script: train.py\nworkdir: {REPO / 'tests' / 'ssh' / 'jobs' / 'sleepy'}\n"
        f"workers: 2\nargs: ['5']\nrestart: {{host_timeout: {HOST_TIMEOUT}, "
        "max_infra_restarts: 0}\n"
    )
    proc = cli.popen("launch", str(job), "--ui", "plain")
    agent, seen = agent_pid(proc)
    os.kill(agent, signal.SIGSTOP)
    time.sleep(3 * HOST_TIMEOUT)
    os.kill(agent, signal.SIGCONT)
    out = "".join(seen) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    state = cli.state(only_run(cli))
    assert (state["phase"], state["failures"]) == ("succeeded", []), out


def _resume_job(tmp_path: Path, name: str, fault: bool) -> Path:
    job = tmp_path / f"{name}.yaml"
    job.write_text(
        f"name: {name}\nscript: train.py\nworkdir: {JOBS / 'resume'}\nworkers: 2\n"
        f"env:\n  FAULT: '{int(fault)}'\n  OUT: {tmp_path / (name + '.pt')}\n"
        "restart:\n  max_infra_restarts: 1\n  backoff_initial: 0.2\n"
        "checkpoint:\n  every_steps: 5\n  keep: 2\n"
    )
    return job


def test_kill_9_of_a_worker_resumes_from_the_last_checkpoint(cli: Cli, tmp_path: Path) -> None:
    import torch

    clean = cli.run("launch", str(_resume_job(tmp_path, "clean", False)), "--ui", "plain")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    faulty = cli.run("launch", str(_resume_job(tmp_path, "faulty", True)), "--ui", "plain")
    assert faulty.returncode == 0, faulty.stdout + faulty.stderr
    assert "rank 1 attempt 2 starts at step 10" in faulty.stdout
    run = next(p for p in cli.runs() if p.name.startswith("faulty"))
    state = cli.state(run.name)
    assert state["restarts"] == 1
    assert state["failures"][0]["message"] == "killed by SIGKILL"
    # judged from torchrun's own record of the failed ranks, not from its printed report
    (recorded,) = (cli.home / "runs" / run.name / "hosts" / "local").glob(
        "torchrun-failures-1.json"
    )
    assert {f["rank"]: f["exitcode"] for f in json.loads(recorded.read_text())}[1] == -9
    a = torch.load(tmp_path / "clean.pt", weights_only=True)
    b = torch.load(tmp_path / "faulty.pt", weights_only=True)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_two_runs_started_at_once_on_one_checkpoint_dir_one_runs_one_exits_2(
    cli: Cli, tmp_path: Path
) -> None:
    """A literal ``checkpoint.dir`` shared by two jobs started in the same instant: the
    directory's claim gives it to one run; the other is refused (exit 2, naming the
    holder) before it makes a run directory or starts a rank."""
    shared = tmp_path / "shared-ckpt"
    jobs = []
    for name in ("first", "second"):
        job = _resume_job(tmp_path, name, False)
        text = job.read_text().replace("env:\n", "env:\n  STEP_SLEEP: '0.05'\n")
        job.write_text(text + f"  dir: {shared}\n")
        jobs.append(job)
    procs = [cli.popen("launch", str(job), "--ui", "plain") for job in jobs]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    (winner,) = [p.name for p in cli.runs()]  # the loser made no run directory
    (refused,) = [o for p, o in zip(procs, outs, strict=True) if p.returncode == 2]
    assert f"checkpoint.dir {shared} is in use by run {winner}" in refused, refused
    assert len(refused.strip().splitlines()) == 1, refused
    assert cli.state(winner)["phase"] == "succeeded"


def test_kill_9_of_the_host_agent_leaves_no_rank_and_the_run_resumes(
    cli: Cli, tmp_path: Path
) -> None:
    """The agent dies without a word: its torchrun and ranks end with it (none goes on
    training or writing checkpoints for an attempt that is over), and the next attempt
    resumes from the checkpoint on the same rendezvous port."""
    job = tmp_path / "agentkill.yaml"
    job.write_text(
        f"name: agentkill\nscript: train.py\nworkdir: {JOBS / 'resume'}\nworkers: 2\n"
        f"env:\n  STEP_SLEEP: '0.3'\n  OUT: {tmp_path / 'out.pt'}\n"
        "restart:\n  max_infra_restarts: 1\n  backoff_initial: 0.2\n"
        "checkpoint:\n  every_steps: 5\n"
    )
    proc = cli.popen("launch", str(job), "--ui", "plain")
    run_id = _wait_running(cli)
    hosts = cli.home / "runs" / run_id / "hosts"
    assert wait_until((hosts / "checkpoints" / "LATEST").is_file, 60), "no checkpoint"
    agent = int((hosts / "local" / "agent.pid").read_text())
    attempt_1 = [p for p in run_processes(run_id) if p != agent]
    assert len(attempt_1) >= 3, attempt_1  # torchrun and its two ranks
    os.kill(agent, signal.SIGKILL)
    # gone at once (left alone, the ranks would train for 4 s more), wherever they went
    assert wait_until(lambda: not [p for p in attempt_1 if alive(p)], 2), [
        cmdline(p) for p in attempt_1 if alive(p)
    ]
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    starts = [int(x.split()[0]) for x in out.split("attempt 2 starts at step ")[1:]]
    assert len(starts) == 2 and min(starts) >= 5, out  # from the checkpoint
    state = cli.state(run_id)
    assert (state["phase"], state["restarts"]) == ("succeeded", 1), state
    assert not run_processes(run_id)


def test_resume_continues_a_run_whose_controller_died(cli: Cli, tmp_path: Path) -> None:
    import torch

    job = tmp_path / "slow.yaml"
    job.write_text(
        f"name: slow\nscript: train.py\nworkdir: {JOBS / 'resume'}\nworkers: 2\n"
        f"env:\n  STEP_SLEEP: '0.3'\n  OUT: {tmp_path / 'slow.pt'}\n"
        "checkpoint:\n  every_steps: 5\n"
    )
    proc = cli.popen("launch", str(job), "--ui", "quiet")
    run_id = _wait_running(cli)
    latest = cli.home / "runs" / run_id / "hosts" / "checkpoints" / "LATEST"
    assert wait_until(latest.is_file, 60), "no checkpoint was written"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)
    assert cli.state(run_id)["phase"] in ("running", "starting")  # as the dead controller left it
    assert json.loads(cli.run("status", run_id, "--json").stdout)["phase"] == "lost"
    resumed = cli.run("launch", "--resume", run_id, "--ui", "plain")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    starts = [int(x.split()[0]) for x in resumed.stdout.split("starts at step ")[1:]]
    assert starts and min(starts) >= 5, resumed.stdout  # from a checkpoint, not from 0
    state = cli.state(run_id)
    assert (state["phase"], state["restarts"]) == ("succeeded", 1)
    assert state["failures"][-1]["exc_type"] == "ControllerLost"
    assert torch.load(tmp_path / "slow.pt", weights_only=True)
    assert not run_processes(run_id)
    again = cli.run("launch", "--resume", run_id)
    assert again.returncode == 2 and "only a run whose controller died" in again.stderr
