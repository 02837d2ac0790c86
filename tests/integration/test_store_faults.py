"""Every record kept (issue 12), on real processes and real file systems: a full disk
under the run store and under the checkpoints (a real tmpfs), a run directory deleted
while its run runs, a corrupt state file next to good runs, spec errors only a plan
sees, and secrets kept out of what is stored and printed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Cli
from tests.integration.procs import run_processes, wait_until
from tests.mounts import resize, tmpfs

JOBS = Path(__file__).parent / "jobs"
pytestmark = pytest.mark.integration


def _job(tmp_path: Path, source: str, *extra: str) -> Path:
    """A job file running ``jobs/<source>/train.py`` on 2 workers, plus ``extra`` lines."""
    job = tmp_path / f"{source}.yaml"
    lines = ["script: train.py", f"workdir: {JOBS / source}", "workers: 2", *extra]
    job.write_text("\n".join(lines) + "\n")
    return job


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def _fails_for_a_full_disk(cli: Cli, job: Path) -> tuple[Path, str, dict[str, Any]]:
    """Launch ``job``; after checking that it failed cleanly for a full disk (exit 1,
    no internal error nor a traceback of dmlctl's own, no restart, no process left),
    its run directory, what was printed and the root cause."""
    proc = cli.run("launch", str(job), "--ui", "plain", timeout=240)
    out = _said(proc)
    assert proc.returncode == 1, out
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, out
    (run,) = cli.runs()
    assert run_processes(run.name) == []
    state = cli.state(run.name)
    assert (state["phase"], state["exit_code"], state["restarts"]) == ("failed", 1, 0)
    cause: dict[str, Any] = state["root_cause"]
    assert cause["exc_type"] == "DiskFull", cause
    return run, out, cause


def test_a_full_disk_under_the_run_store_fails_the_run_cleanly(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "home", "3m") as home:
        cli = Cli(home)
        job = _job(tmp_path, "flood", "args: ['400000']", "strategy: none")
        run, out, cause = _fails_for_a_full_disk(cli, job)
        assert cause["host"] == "controller" and "no space left" in cause["message"]
        assert f"{run}/logs/" in cause["message"], cause  # names the file
        assert "controller: DiskFull: no space left on the device writing" in out
        assert json.loads((run / "summary.json").read_text())["phase"] == "failed"
        assert not [p for p in home.rglob("*") if p.name.endswith(".tmp") or p.name == ".reserve"]
        listing = cli.run("status")
        assert listing.returncode == 0 and run.name in listing.stdout, _said(listing)


def test_a_full_disk_under_the_checkpoints_keeps_the_previous_one(cli: Cli, tmp_path: Path) -> None:
    """2.6 MB per checkpoint (2 ranks of 400 x 400 weights and momentum) on 4 MiB: the
    step-5 checkpoint fits, step 10 does not."""
    with tmpfs(tmp_path / "ckpt", "4m") as root:
        job = _job(tmp_path, "bigckpt", "checkpoint:", "  every_steps: 5", f"  dir: {root}")
        run, _, cause = _fails_for_a_full_disk(cli, job)
        assert str(root) in cause["message"] and "checkpoint step 10" in cause["message"], cause
        assert sorted(p.name for p in root.iterdir()) == [
            ".dmlctl-claim",
            "LATEST",
            "step-000000005",
        ]
        resize(root, "32m")  # space freed: the run goes on from the kept checkpoint
        proc = cli.run("launch", "--resume", run.name, "--ui", "plain", timeout=240)
        assert proc.returncode == 0, _said(proc)
        logs = "".join(p.read_text() for p in sorted((run / "logs").glob("rank-*.log")))
        assert logs.count("starts at step 5") == 2 and logs.count("done at step 20") == 2, logs
        state = cli.state(run.name)
        assert state["phase"] == "succeeded" and state["failures"][-1]["exc_type"] == "DiskFull"


def test_a_deleted_run_directory_stops_the_run_as_failed(cli: Cli, tmp_path: Path) -> None:
    """Checkpoints every step, in the default place (inside the run directory): the
    ranks' saves until they are stopped and the controller's state writes must not
    make the directory again."""
    env = f"env: {{STEP_SLEEP: '0.5', OUT: '{tmp_path / 'out.pt'}'}}"
    job = _job(tmp_path, "resume", env, "checkpoint:", "  every_steps: 1")
    popen = cli.popen("launch", str(job), "--ui", "plain")
    try:

        def stepping() -> bool:
            runs = cli.runs()
            ranks = cli.state(runs[0].name)["ranks"] if runs else []
            return bool(ranks) and all(r["status"] == "running" and r["step"] for r in ranks)

        assert wait_until(stepping, 60), "ranks never started"
        (run,) = cli.runs()
        assert wait_until((run / "hosts" / "checkpoints" / "LATEST").exists, 30)
        gone = run.with_name(run.name + ".deleted")  # rm -rf, without losing a race
        run.rename(gone)  # with the controller making files in it
        shutil.rmtree(gone)
        out, _ = popen.communicate(timeout=30)
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
    assert popen.returncode == 1, out
    assert "was deleted" in out and "succeeded" not in out, out
    assert "controller: RunDirGone: the run directory" in out, out  # not a failed save
    # (the ranks' tracebacks of their failed saves are theirs, shown as such)
    assert "internal error" not in out and "\nTraceback" not in out, out
    assert wait_until(lambda: run_processes(run.name) == [], 10)
    assert not run.exists()  # never made again behind the user's back
    listing = cli.run("status", "--all")
    assert listing.returncode == 0 and run.name not in listing.stdout, _said(listing)


def test_one_corrupt_state_file_hides_no_other_run(cli: Cli, tmp_path: Path) -> None:
    job = _job(tmp_path, "plain")
    for _ in range(2):
        assert cli.run("launch", str(job), "--ui", "quiet").returncode == 0
    good, bad = cli.runs()
    (bad / "state.json").write_text("{")
    listing = cli.run("status")
    assert listing.returncode == 0, _said(listing)
    assert good.name in listing.stdout
    assert f"run {bad.name}: state unreadable (not valid JSON" in _said(listing)
    as_json = cli.run("status", "--json")
    assert as_json.returncode == 0, _said(as_json)
    rows = {r["run_id"]: r for r in json.loads(as_json.stdout)}
    assert rows[bad.name]["error"].startswith("not valid JSON") and rows[good.name]["phase"]
    one = cli.run("status", bad.name)
    assert one.returncode == 2 and one.stderr.count("\n") == 1, _said(one)
    assert f"run {bad.name}: state unreadable" in one.stderr
    (bad / "state.json").write_text("[]")
    assert cli.run("status").returncode == 0
    assert cli.run("status", bad.name).returncode == 2
    (bad / "state.json").unlink()
    (bad / "state.json").mkdir()  # a directory: listed as unreadable, never hidden
    listing = cli.run("status", "--all")
    assert listing.returncode == 0 and good.name in listing.stdout, _said(listing)
    assert f"run {bad.name}: state unreadable (state.json: Is a directory)" in _said(listing)
    one = cli.run("status", bad.name)
    assert one.returncode == 2 and "Is a directory" in one.stderr, _said(one)


def test_the_ranks_files_are_masked_when_the_controller_is_killed(cli: Cli, tmp_path: Path) -> None:
    """The ranks write their output files themselves, the secret in clear while they
    run; with the controller killed (no end of run to mask them), each host agent
    masks its attempt's files once its ranks are gone."""
    token = "tok-killed-controller-4242"
    env = f"env: {{API_TOKEN: '{token}', NAMES: API_TOKEN, LINGER: '120'}}"
    job = _job(tmp_path, "secrets", env, "strategy: none")
    popen = cli.popen("launch", str(job), "--ui", "plain")
    try:

        def printed() -> bool:
            outs = [p for r in cli.runs() for p in (r / "hosts").rglob("rank-*.stdout")]
            return len(outs) == 2 and all(token.encode() in p.read_bytes() for p in outs)

        assert wait_until(printed, 60), "the ranks never printed the token"
        os.kill(popen.pid, signal.SIGKILL)  # the controller: it runs in the CLI's process
        popen.communicate(timeout=30)
        (run,) = cli.runs()
        assert wait_until(lambda: run_processes(run.name) == [], 60), run_processes(run.name)
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
    outs = sorted((run / "hosts").rglob("rank-*.stdout"))
    assert len(outs) == 2
    for path in [p for p in run.rglob("*") if p.is_file() and p.name != "secrets.json"]:
        assert token.encode() not in path.read_bytes(), path
    for path in outs:
        assert b"API_TOKEN=*** (26 characters)" in path.read_bytes(), path


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('env: {X: "a\\0b"}', "env"),
        (f"env: {{BIG: {'x' * 200_000}}}", "env"),  # over what one value may hold
        ('checkpoint: {dir: "/tmp/a\\0b"}', "dir"),
    ],
    # Short ids: the test's id reaches the CLI's environment (PYTEST_CURRENT_TEST), where
    # one variable may hold at most 128 KiB.
    ids=["env-nul", "env-200k", "dir-nul"],
)
def test_what_would_fail_at_start_is_refused_before_anything_starts(
    cli: Cli, tmp_path: Path, line: str, key: str
) -> None:
    job = _job(tmp_path, "plain", line)
    for extra in (["--dry-run"], []):
        proc = cli.run("launch", str(job), "--ui", "plain", *extra)
        assert proc.returncode == 2, _said(proc)
        (said,) = proc.stderr.splitlines()
        assert said.startswith(f"dmlctl: {job}:4 ") and key in said and len(said) <= 300, said
    assert cli.runs() == [] and not (cli.home / "runs").exists()


SECRETS = {
    "DB_URL": "postgres://u:s3cret-xyz@h/db",
    "API_TOKEN": "tok-abc-123456",
    "HF_KEY": "hf_Zq8rT2mVx9LpW4nB7cK3yJ6d",
}


#: Script arguments that hold secrets, and the part of each that must stay hidden.
SECRET_ARGS = {
    "--token=ghp_Zq8rT2mVx9LpW4nB7cK3yJ6dQ1": "ghp_Zq8rT2mVx9LpW4nB7cK3yJ6dQ1",
    "postgres://u:argpw-9876@h/db": "argpw-9876",
    "--password": "",  # a flag and its value as two arguments
    "plainpass99": "plainpass99",
}
#: Values the run knows only from its setup (``export NAME=value``, a header) and its
#: ``secrets:`` list, each also given to the ranks under a name that says nothing.
KNOWN_ELSEWHERE = {
    "ECHO_EXPORTED": "setup-only-value-77",
    "ECHO_BEARER": "bearer-only-value-88",
    "ECHO_LISTED": "listed-value-555",
}
SETUP = (
    "export GITHUB_TOKEN=setup-only-value-77 && curl -H 'Authorization: Bearer "
    "bearer-only-value-88' https://example.invalid/x && pip install --no-deps nothing"
)


def test_secrets_stay_out_of_what_is_stored_and_printed(cli: Cli, tmp_path: Path) -> None:
    """Every form of secret the run knows (secret-named env, URL passwords, a flag's
    value in both forms, a bare token, a setup's export and header, the job's
    ``secrets:``) is hidden as ``***`` on screen and in every file of the run
    directory, the ranks' own output files included; the ranks get the real values."""
    names = ",".join([*SECRETS, *KNOWN_ELSEWHERE])
    env = ", ".join(
        f"{k}: '{v}'" for k, v in {**SECRETS, **KNOWN_ELSEWHERE, "NAMES": names}.items()
    )
    args = ", ".join(f"'{a}'" for a in SECRET_ARGS)
    extra = (f"env: {{{env}}}", "strategy: none", f"args: [{args}]", f'setup: "{SETUP}"')
    job = _job(tmp_path, "secrets", *extra, "secrets: [listed-value-555]")
    dry = cli.run("launch", str(job), "--dry-run")
    assert dry.returncode == 0, _said(dry)
    assert "postgres://u:***@h/db" in dry.stdout
    proc = cli.run("launch", str(job), "--ui", "plain")
    assert proc.returncode == 0, _said(proc)
    (run,) = cli.runs()
    logs = (run / "logs" / "rank-0.log").read_text()
    stored = [p for p in run.rglob("*") if p.is_file() and p.name != "secrets.json"]
    hidden = [
        *(v if k != "DB_URL" else "s3cret-xyz" for k, v in SECRETS.items()),
        *(v for v in SECRET_ARGS.values() if v),
        *KNOWN_ELSEWHERE.values(),
    ]
    for name, value in {**SECRETS, **KNOWN_ELSEWHERE}.items():  # the ranks got them
        assert f"{name}=" in logs and f"({len(value)} characters)" in logs, logs
    for i, arg in enumerate(SECRET_ARGS):
        assert f"arg {i} ({len(arg)} characters)" in logs, logs
    for value in hidden:
        for text in (dry.stdout, proc.stdout, proc.stderr):
            assert value not in text, text
        for path in stored:  # hosts/: the ranks' own output files, masked at the end
            assert value.encode() not in path.read_bytes(), path
    assert "DB_URL=postgres://u:***@h/db" in logs and "API_TOKEN=***" in logs
    assert "ECHO_EXPORTED=*** (19 characters)" in logs
    stored_job = yaml.safe_load((run / "specs" / "job.yaml").read_text())
    assert stored_job["setup"] == SETUP.replace("setup-only-value-77", "***").replace(
        "bearer-only-value-88", "***"
    )  # the rest of the command stays readable
    assert stored_job["secrets"] == ["***"]
    real = json.loads((run / "secrets.json").read_text())
    assert {k: v for host in real.values() for k, v in host.items() if k in SECRETS} == SECRETS
    run_key = real[":key"]["key"]  # the run's own: kept here alone, the ranks' file removed
    assert len(run_key) == 64 and not list(run.rglob("run.key"))
    for path in stored:
        assert run_key.encode() not in path.read_bytes(), path
    for arg in SECRET_ARGS:
        if SECRET_ARGS[arg]:
            assert arg in real[":args"].values()
    plan = json.loads((run / "plan.json").read_text())
    assert plan["args"] == ["--token=***", "postgres://u:***@h/db", "--password", "***"]
    for path in [run, *run.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {oct(mode)}"
