"""What a user's real script meets: it ends like under torchrun, is stopped like under
torchrun, sees what torchrun gives it, and never silently trains without the strategy
its job asked for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.integration.procs import run_processes, wait_until

JOBS = Path(__file__).parent / "jobs"
pytestmark = pytest.mark.integration


def _job(tmp_path: Path, source: str, **keys: str) -> Path:
    """A job file running ``jobs/<source>/train.py`` with extra top-level keys."""
    job = tmp_path / f"{source}.yaml"
    lines = ["script: train.py", f"workdir: {JOBS / source}", "workers: 2"]
    lines += [f"{k}: {v}" for k, v in keys.items()]
    job.write_text("\n".join(lines) + "\n")
    return job


def _logs(cli: Cli, run_id: str) -> str:
    """Every rank's and every host agent's log (not the merged copy of them)."""
    logs = cli.home / "runs" / run_id / "logs"
    return "".join(p.read_text() for p in sorted(logs.glob("*.log")) if p.name != "merged.log")


def _training(cli: Cli) -> str:
    """The id of the one run, once every rank of it has logged a step."""

    def stepping() -> bool:
        runs = cli.runs()
        ranks = cli.state(runs[0].name)["ranks"] if runs else []
        return bool(ranks) and all(r["status"] == "running" and r["step"] for r in ranks)

    assert wait_until(stepping, 60), "ranks never started"
    return cli.runs()[0].name


def test_a_script_ends_and_sees_exactly_what_torchrun_gives_it(cli: Cli, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    job = _job(
        tmp_path,
        "exitwork",
        strategy="none",
        args='["--out", "results", "-v"]',
        env=f"{{OUT_DIR: {out_dir}}}",
    )
    proc = cli.run("launch", str(job), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = cli.runs()[-1].name
    for rank in (0, 1):  # the work still in flight when the script returned was done
        assert (out_dir / f"rank-{rank}.thread").read_text() == "done\n"
        assert (out_dir / f"rank-{rank}.executor").read_text() == "done\n"
        assert (out_dir / f"rank-{rank}.unclosed").read_text() == "kept\n"
    logs = _logs(cli, run_id)
    assert logs.count("atexit ran") == 2, logs
    assert logs.count("attempt=1") == 2, logs
    assert "Warning" not in logs, logs  # no RuntimeWarning, on any rank or in the agent
    state = cli.state(run_id)
    assert (state["phase"], state["strategy"]) == ("succeeded", "none")
    # The same script under bare torchrun prints the same argv, __file__ and __name__.
    bare = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "1",
            "train.py",
            "--out",
            "results",
            "-v",
        ],
        cwd=JOBS / "exitwork",
        env={**os.environ, "OUT_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bare.returncode == 0, bare.stderr
    seen = next(line for line in bare.stdout.splitlines() if line.startswith("argv="))
    script = JOBS / "exitwork" / "train.py"
    assert seen == f"argv=['train.py', '--out', 'results', '-v'] file={script} main=__main__"
    assert seen in logs, logs


def test_a_stop_is_a_stop_whatever_the_sigterm_handler_returns(cli: Cli, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    job = _job(tmp_path, "sigterm", env=f"{{OUT_DIR: {out_dir}}}", restart="{stop_grace: 20}")
    proc = cli.popen("launch", str(job), "--ui", "plain")
    try:
        run_id = _training(cli)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal
        assert proc.wait(40) == 130
        output = proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    state = cli.state(run_id)
    assert (state["phase"], state["exit_code"]) == ("stopped", 130), output
    assert "succeeded" not in output, output
    for rank in (0, 1):  # each rank got SIGTERM and the time to save
        assert (out_dir / f"rank-{rank}.saved").read_text() == "saved\n"
    assert _logs(cli, run_id).count("got signal 15, saving") == 2
    assert {r["status"] for r in state["ranks"]} == {"stopped"}
    assert wait_until(lambda: not run_processes(run_id), 10), run_processes(run_id)


def test_a_strategy_that_needs_the_runtime_refuses_a_plain_script(cli: Cli, tmp_path: Path) -> None:
    proc = cli.run("launch", str(_job(tmp_path, "plainddp", strategy="local-sgd")), "--ui", "plain")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    state = cli.state(cli.runs()[-1].name)
    cause = state["root_cause"]
    assert cause["exc_type"] == "StrategyNotApplied", cause
    assert "strategy 'local-sgd' was never applied" in cause["message"]
    assert "ctx.prepare(model, optimizer)" in cause["message"]
    assert "strategy: none" in cause["message"]
    assert "trained" not in proc.stdout  # it failed at the first step, before any update


def test_a_parameter_server_never_runs_the_script(cli: Cli, tmp_path: Path) -> None:
    job = _job(tmp_path, "plainddp", strategy="asgd", parameter_servers="1")
    proc = cli.run("launch", str(job), "--ui", "plain")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_id = cli.runs()[-1].name
    cause = cli.state(run_id)["root_cause"]
    assert cause["exc_type"] == "StrategyNotApplied", cause
    assert "replace torch.distributed.init_process_group(...)" in cause["message"]
    server_log = cli.home / "runs" / run_id / "logs" / "rank-2.log"  # worker,worker,server
    assert "script starts" not in (server_log.read_text() if server_log.exists() else "")
    assert 1 <= _logs(cli, run_id).count("script starts") <= 2  # workers only
    assert not run_processes(run_id)


def test_a_plain_ddp_script_under_the_default_strategy_shows_none(cli: Cli, tmp_path: Path) -> None:
    proc = cli.run("launch", str(_job(tmp_path, "plainddp")), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = cli.runs()[-1].name
    assert "Warning" not in _logs(cli, run_id)  # torch.distributed loaded: still no noise
    state = cli.state(run_id)
    assert (state["phase"], state["strategy"]) == ("succeeded", "none")
    listing = cli.run("status")
    assert " none " in listing.stdout, listing.stdout


def test_a_second_ctrl_c_kills_at_once_and_leaves_no_orphan(cli: Cli, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    job = _job(
        tmp_path, "sigterm", env=f"{{OUT_DIR: {out_dir}, SAVE_S: '60'}}", restart="{stop_grace: 60}"
    )
    proc = cli.popen("launch", str(job), "--ui", "plain")
    try:
        run_id = _training(cli)
        os.killpg(proc.pid, signal.SIGINT)
        assert wait_until(lambda: "saving" in _logs(cli, run_id), 10)  # in their 60 s save
        os.killpg(proc.pid, signal.SIGINT)  # impatient: kill now
        assert proc.wait(20) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # The ranks ran in sessions of their own, saving in their SIGTERM handler: gone too.
    assert wait_until(lambda: not run_processes(run_id), 5), run_processes(run_id)


def _interpreters(cli: Cli, tmp_path: Path, env: str) -> list[dict[str, object]]:
    """What each of the two ranks of ``jobs/interpreter`` saw, by rank."""
    proc = cli.run("launch", str(_job(tmp_path, "interpreter", env=env)), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = [
        json.loads(line) for line in _logs(cli, cli.runs()[-1].name).splitlines() if "{" in line
    ]
    return sorted(seen, key=lambda s: int(str(s["rank"])))


def test_a_rank_forked_from_the_warm_torchrun_is_what_a_new_interpreter_is(
    cli: Cli, tmp_path: Path
) -> None:
    """Ranks are forked from the torchrun that has torch (and torch._dynamo, which
    every optimizer imports) imported already, unless the job sets a variable read
    when Python or torch start (then they are new processes); either way the script
    meets the same interpreter."""
    forked = _interpreters(cli, tmp_path, "{}")
    new = _interpreters(cli, tmp_path, "{PYTHONHASHSEED: '7'}")
    assert [s["preloaded"] for s in forked] == [True, True]
    assert [s["preloaded"] for s in new] == [False, False]
    assert forked[0]["numpy"] != forked[1]["numpy"]  # each rank seeded afresh
    for a, b in zip(forked, new, strict=True):
        for key in ("preloaded", "numpy"):
            del a[key], b[key]
        assert a == b
