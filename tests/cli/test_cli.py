"""The CLI as a user meets it: exit codes, one-line errors, nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dmlctl.cli.app import main

JOB = "script: train.py\nworkers: 2\n"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("DMLCTL_HOME", str(home))
    return home


def project(tmp_path: Path, job: str = JOB) -> Path:
    d = tmp_path / "proj"
    d.mkdir(exist_ok=True)
    (d / "train.py").write_text("print('hi')\n")
    (d / "job.yaml").write_text(job)
    return d / "job.yaml"


@pytest.mark.parametrize(
    ("job", "args", "expected"),
    [
        (None, [], "no such file"),
        ("workers: [1\n", [], "job.yaml:"),
        ("script: train.py\nwrokers: 2\n", [], "did you mean 'workers'"),
        ("script: train.py\nworkers: 0\n", [], "job.yaml:2 workers"),
        ("script: train.py\nstrategy: nope\n", [], "unknown strategy 'nope'"),
        (JOB, ["--workers", "0"], "workers"),
        (JOB, ["--ui", "fancy"], "--ui: expected one of"),
        (JOB, ["--cluster", "missing.yaml"], "missing.yaml: no such file"),
        (JOB, ["--connect-timeout", "nan"], "--connect-timeout: must be a number of seconds"),
        (JOB, ["--connect-timeout", "inf"], "at most 3600, got inf"),
        (JOB, ["--connect-timeout", "1e308"], "got 1e+308"),
        (JOB, ["--connect-timeout", "0"], "above 0"),
        # refused before the oversubscription warning of the same command is printed
        (JOB, ["--workers", "64", "--connect-timeout", "-1"], "--connect-timeout"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line_and_no_run(
    tmp_path: Path,
    home: Path,
    capsys: pytest.CaptureFixture[str],
    job: str | None,
    args: list[str],
    expected: str,
) -> None:
    path = project(tmp_path, job) if job is not None else tmp_path / "nowhere" / "job.yaml"
    code = main(["launch", str(path), *args])
    out, err = capsys.readouterr()
    assert code == 2
    assert expected in err and err.count("\n") == 1, err
    assert "Traceback" not in out + err
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_every_spec_error_is_reported_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project(tmp_path, "script: train.py\nworkers: -1\nargs: 3\nenvv: {}\n")
    assert main(["launch", str(path)]) == 2
    err = capsys.readouterr().err
    assert "job.yaml:2 workers" in err
    assert "job.yaml:3 args" in err
    assert "job.yaml:4" in err and "did you mean 'env'" in err


def test_dry_run_prints_the_plan(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project(tmp_path, JOB + "env:\n  API_TOKEN: s3cret\n")
    assert main(["launch", str(path), "--dry-run", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "--nproc-per-node 1" in out
    assert "API_TOKEN=***" in out and "s3cret" not in out
    assert not (home / "runs").exists()


def test_a_cluster_files_slots_are_never_exceeded(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project(tmp_path, JOB)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("hosts:\n  - name: one\n    address: localhost\n    slots: 1\n")
    assert main(["launch", str(path), "--cluster", str(cluster), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "the job asks for 2 workers but the cluster has 1 slot (one: 1)" in err


def test_more_workers_than_local_slots_run_oversubscribed_with_a_warning(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dmlctl.spec.local import default_cluster

    slots = default_cluster().hosts[0].slots or 1
    path = project(tmp_path, JOB.replace("workers:", "# workers:") + "workers: auto\n")
    assert main(["launch", str(path), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert f"--nproc-per-node {slots}" in captured.out and "oversubscribed" not in captured.err
    more = slots + 1
    assert main(["launch", str(path), "--dry-run", "--workers", str(more)]) == 0
    captured = capsys.readouterr()
    assert f"--nproc-per-node {more}" in captured.out
    assert f"warning: {more} workers on this machine's {slots} " in captured.err
    assert "oversubscribed" in captured.err


def test_dry_run_shows_how_ssh_config_resolves_each_host(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    user_home = tmp_path / "user"
    (user_home / ".ssh").mkdir(parents=True)
    (user_home / ".ssh" / "config").write_text(
        "Host gpu-node-1\n  HostName 10.9.8.7\n  User alice\n  Port 2222\n"
        "  ProxyJump bastion.example\n"
    )
    monkeypatch.setenv("HOME", str(user_home))
    path = project(tmp_path, "script: train.py\nworkers: 1\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "hosts:\n  - name: node1\n    address: gpu-node-1\n    slots: 1\n"
        "    workdir: /srv/train\n    python: /usr/bin/python3\n"
    )
    assert main(["launch", str(path), "--cluster", str(cluster), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "gpu-node-1 over SSH as alice@10.9.8.7:2222 via bastion.example" in out
    (user_home / ".ssh" / "config").write_text("Host gpu-node-1\n  HostName fd00::7\n  User bob\n")
    assert main(["launch", str(path), "--cluster", str(cluster), "--dry-run"]) == 0
    assert "gpu-node-1 over SSH as bob@[fd00::7]:22" in capsys.readouterr().out  # bracketed
    # the hosts meet at the controller's store, at this machine's address towards them
    assert "the run's store, held by this controller" in out
    assert not (home / "runs").exists()


def test_a_launch_whose_first_host_is_out_of_reach_shows_every_hosts_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As doctor does: it named the first host alone, as 'cannot pick a rendezvous port'."""
    import socket

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config
    monkeypatch.setenv("COLUMNS", "200")  # a row a line
    ports = []
    for _ in range(2):  # nothing listens there: each connection is refused at once
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cluster = tmp_path / "cluster.yaml"
    hosts = [
        f"{{name: n{i}, address: 127.0.0.1, port: {p}, slots: 1}}" for i, p in enumerate(ports)
    ]
    cluster.write_text("hosts:\n" + "".join(f"  - {h}\n" for h in hosts))
    path = project(tmp_path)
    code = main(["launch", str(path), "--cluster", str(cluster), "--connect-timeout", "5"])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    for name in ("n0", "n1"):  # a row each, saying why
        (row,) = [line for line in out.splitlines() if line.strip().startswith(name)]
        assert "refused" in row, out
    assert "preflight failed on 2 of 2 hosts" in err and "rendezvous port" not in err, err


def test_status_with_no_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 0
    assert "no runs" in capsys.readouterr().out
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize("below", ["", "/sub"])
@pytest.mark.parametrize("command", [["status"], ["launch", "job.yaml", "--ui", "plain"]])
def test_a_home_that_is_a_file_is_refused_by_every_command(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    below: str,
) -> None:
    job = project(tmp_path)
    monkeypatch.chdir(job.parent)
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("DMLCTL_HOME", f"{tmp_path}/afile{below}")
    assert main(command) == 2
    (said,) = capsys.readouterr().err.splitlines()
    assert said.startswith(f"dmlctl: DMLCTL_HOME: {tmp_path}/afile") and "is a file" in said


@pytest.mark.parametrize("command", [["status", "nope"], ["logs", "nope"], ["stop", "nope"]])
def test_unknown_run_id(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(command) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_init_writes_project_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "myproj"
    assert main(["init", str(target)]) == 0
    names = sorted(p.name for p in target.iterdir())
    assert names == ["cluster.yaml", "job.yaml", "train.py"]
    (target / "train.py").write_text("# mine\n")
    assert main(["init", str(target)]) == 2
    assert "--force" in capsys.readouterr().err
    assert (target / "train.py").read_text() == "# mine\n"
    assert main(["init", str(target), "--force"]) == 0
    assert (target / "train.py").read_text() != "# mine\n"


def test_init_fills_this_directory_by_default_and_says_the_next_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == [
        "cluster.yaml",
        "job.yaml",
        "train.py",
    ]
    assert "next:\n  dmlctl launch job.yaml" in out and "cd " not in out
    assert "mypy" not in (tmp_path / "train.py").read_text()  # nothing of ours in it
    assert main(["init", "my proj"]) == 0
    assert "next:\n  cd 'my proj' && dmlctl launch job.yaml" in capsys.readouterr().out


def test_init_project_specs_are_valid(tmp_path: Path) -> None:
    from dmlctl.spec import load_cluster, load_job

    target = tmp_path / "p"
    assert main(["init", str(target)]) == 0
    job = load_job(target / "job.yaml")
    cluster = load_cluster(target / "cluster.yaml")
    assert job.script == "train.py"
    assert cluster.resolved_hosts()[0].is_local


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("dmlctl ")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("init", "launch", "status", "logs", "stop", "bench"):
        assert command in out


@pytest.mark.parametrize("command", [["launch"], ["logs"], ["status"], ["bench", "accuracy"]])
def test_help_shows_no_type_beside_a_flag(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "--help" in out and "<bool>" not in out


def test_launch_help_says_how_to_follow_a_detached_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["launch", "--help"]) == 0
    words = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "Run in the background and print its id; dmlctl attach ID shows the live view" in words


def test_help_paragraphs_wrap_to_the_terminal_and_advise_says_what_it_takes() -> None:
    """At 80 columns a paragraph of a command's help is wrapped by the terminal's
    width, not broken again where the source's lines end (a short line inside it)."""
    env = {**os.environ, "COLUMNS": "80"}
    argv = [sys.executable, "-m", "dmlctl", "bench", "advise", "--help"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "Each candidate runs" in line)
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    paragraph = lines[start:end]
    assert len(paragraph) >= 2 and all(len(line.rstrip()) > 60 for line in paragraph[:-1]), out
    words = " ".join(out.replace("│", " ").split())
    for said in (
        "where METRIC is any value your script logs",  # the metric names it takes
        "Quote it: the shell reads > and < as redirections",
        "up to 50 minutes per scenario",  # the default budget in all
        "Example: dmlctl bench advise job.yaml --target 'test_acc>=0.97'",
    ):
        assert said in words, out


def test_cli_never_imports_torch() -> None:
    code = (
        "import glob, sys\n"
        "from dmlctl.cli.app import main\n"
        "main(['status'])\n"
        "main(['--help'])\n"
        "for job in sorted(glob.glob('examples/strategies/*.yaml')):\n"
        "    assert main(['launch', job, '--dry-run']) == 0, job\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'fabric' not in sys.modules, 'fabric imported for a local run'\n"
    )
    repo = Path(__file__).resolve().parent.parent.parent
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr


def test_internal_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dmlctl.runs.store as store

    def broken(self: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store.RunStore, "runs", broken)
    assert main(["status"]) == 3
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: disk on fire" in err and "--debug" in err


def test_strategies_lists_every_strategy_and_one_strategys_params(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dmlctl.strategies import registry

    assert main(["strategies"]) == 0
    out = capsys.readouterr().out
    for name in registry.names():
        assert name in out
    assert "required" in out  # the parameter-server strategies say so
    assert main(["strategies", "ssp"]) == 0
    out = capsys.readouterr().out
    assert "staleness" in out and "parameter_servers" in out
    # every column its runs add, with its meaning (measured: the examples' metrics)
    assert "  stale med/max: versions behind, median/max" in out
    assert "  spread: fastest minus slowest worker's clock" in out
    from dmlctl.ui.metric_columns import STRATEGY_COLUMNS

    for name in registry.names():
        assert set(registry.columns(name)) <= set(STRATEGY_COLUMNS), name
    for name in registry.names():  # what its defaults reach, measured, for every one
        assert main(["strategies", name]) == 0
        quality = registry.load(name).QUALITY
        assert quality.strip() and "quality: " in capsys.readouterr().out
    assert main(["strategies", "adadelay"]) == 0
    words = " ".join(capsys.readouterr().out.split())  # as wrapped at any width
    assert "replaces your optimizer with plain SGD" in words  # why it misses the LM's bound
    assert main(["strategies", "nope"]) == 2
    assert "unknown strategy 'nope'" in capsys.readouterr().err
    assert main(["strategies", "local_sgd"]) == 2
    assert "(did you mean 'local-sgd'?)" in capsys.readouterr().err


def test_strategy_parameters_at_80_columns_keep_their_meaning_readable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a meaning column squeezed to a word per line: one block per parameter. Piped,
    the width is 80 (``COLUMNS`` unset) or ``COLUMNS``."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["strategies", "ssp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert "staleness  int  default 3  (≥ 0, ≤ 1,000,000)" in lines, lines
    assert any(line.startswith("    s: the most clocks a worker may be ahead") for line in lines)
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["strategies", "ssp"]) == 0
    assert "param " in capsys.readouterr().out  # wide enough for the table


def test_one_strategys_params_show_type_derived_default_and_range() -> None:
    from dmlctl.strategies.easgd.params import Params
    from dmlctl.strategies.params import default_text, range_text, type_name

    fields = Params.model_fields

    assert type_name(fields["rho"].annotation) == "float"
    assert default_text(fields["rho"]) == "alpha/lr"  # derived at start: the rule
    assert range_text(fields["rho"]) == "> 0, ≤ 1,000,000"
    assert (type_name(fields["final"].annotation), default_text(fields["final"])) == (
        "consensus | local",
        "consensus",
    )
    assert range_text(fields["beta"]) == "> 0, ≤ 1"


@pytest.mark.parametrize("args", [["nosuch"], ["launch", "--bogus"]])
def test_unknown_command_or_option_is_bad_input(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and "No such" in err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-3"])
def test_doctor_refuses_a_connect_timeout_that_is_not_a_time(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--connect-timeout", value]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("dmlctl: --connect-timeout: must be a number of seconds"), err


def test_a_run_on_this_machine_meets_at_the_controllers_store_on_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One local host or two: the torchruns meet at the controller's store on the
    loopback address (a free port as each attempt starts), which no other machine can
    reach; no torchrun serves a store."""
    path = project(tmp_path, "script: train.py\nworkers: 2\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "hosts:\n  - {name: a, address: localhost, slots: 1}\n"
        "  - {name: b, address: localhost, slots: 1}\n"
    )
    for extra in ([], ["--cluster", str(cluster)]):
        assert main(["launch", str(path), *extra, "--dry-run"]) == 0
        out = capsys.readouterr().out
        line = next(s for s in out.splitlines() if s.startswith("rendezvous:"))
        assert line.startswith("rendezvous: c10d at 127.0.0.1:0, the run's store, held by"), line


def test_logs_on_a_terminal_escapes_what_a_rank_wrote(home: Path) -> None:
    """``dmlctl logs`` on a pty: no rank can clear, retitle or reprogram the terminal;
    ``--raw`` gives the bytes."""
    import pty

    from dmlctl.runs.store import RunStore
    from tests.unit.test_runs import finished_state

    run = RunStore(home).create("r1")
    run.write_state(finished_state("r1"))
    hostile = "[rank 0] a\x1b[2Jb \x1b]0;owned\x07 \x9b2J \x00z\n"  # \x9b: C1 CSI
    (run.logs / "merged.log").write_text(hostile, encoding="utf-8")

    def on_a_pty(*extra: str) -> bytes:
        leader, follower = pty.openpty()
        argv = [sys.executable, "-m", "dmlctl", "logs", "r1", *extra]
        proc = subprocess.run(argv, stdout=follower, stderr=subprocess.PIPE, timeout=60)
        os.close(follower)
        assert proc.returncode == 0, proc.stderr
        seen = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(leader, 4096):
                seen += chunk
        os.close(leader)
        return seen

    escaped = on_a_pty()
    assert not {"\x1b", "\x9b", "\x00"} & set(escaped.decode())
    assert b"[rank 0] ab \\x1b]0;owned\\x07 \\x9b2J \\x00z" in escaped
    assert b"\x1b[2J" in on_a_pty("--raw")
