"""dmlctl against real sshd hosts on loopback: launch, teardown, host keys, preflight."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dmlctl.provision.sync import excludes_for, local_files, sync_host
from dmlctl.transport.ssh import SshOptions, SSHTransport
from tests.conftest import Cli
from tests.integration.procs import cmdline, parent, run_processes, wait_until
from tests.ssh.lab import SshHost, SshLab

JOBS = Path(__file__).parent / "jobs"
FOREVER = Path(__file__).parent.parent / "integration" / "jobs" / "forever"
pytestmark = pytest.mark.ssh


class LabCli(Cli):
    """The real CLI with the lab's HOME (its ~/.ssh) and an own DMLCTL_HOME."""

    def __init__(self, home: Path, lab: SshLab) -> None:
        super().__init__(home)
        self.lab = lab

    @property
    def env(self) -> dict[str, str]:
        return self.lab.env(DMLCTL_HOME=str(self.home), COLUMNS="160")


@pytest.fixture
def lcli(ssh_lab: SshLab, tmp_path: Path) -> LabCli:
    return LabCli(tmp_path / "home", ssh_lab)


def cluster_file(lab: SshLab, tmp_path: Path, extra_hosts: str = "", **per_host: str) -> Path:
    """A cluster spec naming the lab's hosts by their ~/.ssh/config alias."""
    lines = ["defaults:", "  slots: 2", f"  python: {sys.executable}", "hosts:"]
    for h in lab.hosts:
        lines += [f"  - name: {h.alias}", f"    address: {h.alias}", f"    workdir: {h.workdir}"]
        if h.alias in per_host:
            lines.append(f"    {per_host[h.alias]}")
    path = tmp_path / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n" + extra_hosts)
    return path


def only_run(cli: Cli) -> str:
    runs = cli.runs()
    assert len(runs) == 1, runs
    return runs[0].name


def test_two_hosts_two_workers_each(lcli: LabCli, ssh_lab: SshLab, tmp_path: Path) -> None:
    cluster = cluster_file(ssh_lab, tmp_path)
    proc = lcli.run(
        "launch", str(JOBS / "metrics" / "job.yaml"), "--cluster", str(cluster), "--ui", "plain"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = only_run(lcli)
    run = lcli.home / "runs" / run_id
    state = lcli.state(run_id)
    assert state["phase"] == "succeeded"
    hosts = sorted(r["host"] for r in state["ranks"])
    assert hosts == ["node-a", "node-a", "node-b", "node-b"]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {(r["host"], r["rank"]) for r in records} == {
        (r["host"], r["rank"]) for r in state["ranks"]
    }
    assert {r["rank"] for r in records} == {0, 1, 2, 3}
    for rank in range(4):
        assert f"rank {rank} of 4" in (run / "logs" / f"rank-{rank}.log").read_text()
    for host in ("node-a", "node-b"):  # kept on each host, collected at the end
        collected = run / "hosts" / host
        said = proc.stderr[-2000:]  # "could not collect rank files from …" says why
        assert sorted(p.name for p in collected.glob("rank-*.stdout")), (collected, said)
        assert (collected / "agent.pid").is_file()
    assert not run_processes(run_id)


def _wait_running(cli: Cli, timeout: float = 90) -> str:
    assert wait_until(
        lambda: (
            len(cli.runs()) == 1
            and all(r["status"] == "running" for r in cli.state(cli.runs()[0].name)["ranks"])
        ),
        timeout,
    ), "ranks never started"
    return cli.runs()[0].name


def test_ctrl_c_stops_every_host(lcli: LabCli, ssh_lab: SshLab, tmp_path: Path) -> None:
    cluster = cluster_file(ssh_lab, tmp_path)
    proc = lcli.popen(
        "launch",
        str(FOREVER / "job.yaml"),
        "--cluster",
        str(cluster),
        "--workers",
        "4",
        "--ui",
        "plain",
    )
    try:
        run_id = _wait_running(lcli)
        assert {r["host"] for r in lcli.state(run_id)["ranks"]} == {"node-a", "node-b"}
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(10) == 130
        assert wait_until(lambda: not run_processes(run_id), 10 - (time.monotonic() - started))
        assert lcli.state(run_id)["phase"] == "stopped"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_killed_controller_leaves_nothing_on_any_host(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    cluster = cluster_file(ssh_lab, tmp_path)
    proc = lcli.popen(
        "launch",
        str(FOREVER / "job.yaml"),
        "--cluster",
        str(cluster),
        "--workers",
        "4",
        "--ui",
        "quiet",
    )
    run_id = _wait_running(lcli)
    assert len(run_processes(run_id)) >= 8  # agents, torchruns, ranks, their children
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


def test_stopping_one_run_leaves_the_other_alone(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    cluster = cluster_file(ssh_lab, tmp_path)
    first = lcli.run(
        "launch", str(FOREVER / "job.yaml"), "--cluster", str(cluster), "--workers", "4", "--detach"
    )
    second = lcli.run(
        "launch", str(JOBS / "sleepy" / "job.yaml"), "--cluster", str(cluster), "--detach"
    )
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = first.stdout.strip(), second.stdout.strip()
    assert wait_until(
        lambda: all(r["status"] == "running" for rid in (a, b) for r in lcli.state(rid)["ranks"]),
        90,
    )
    stop = lcli.run("stop", a)
    assert stop.returncode == 0, stop.stderr
    assert wait_until(lambda: not run_processes(a), 10), run_processes(a)
    assert run_processes(b), "stopping one run touched the other"
    assert wait_until(lambda: lcli.state(b)["phase"] == "succeeded", 60), lcli.state(b)
    assert lcli.state(a)["phase"] == "stopped"


def test_unknown_host_key_is_refused_with_its_fingerprint(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    s = ssh_lab.stranger
    cluster = cluster_file(
        ssh_lab,
        tmp_path,
        extra_hosts=(
            f"  - name: stranger\n    address: {s.address}\n    port: {s.port}\n"
            f"    identity_file: {ssh_lab.identity_file}\n    workdir: {s.workdir}\n"
        ),
    )
    proc = lcli.run(
        "launch", str(JOBS / "metrics" / "job.yaml"), "--cluster", str(cluster), "--workers", "6"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "stranger" in out and "is not known" in out and "SHA256:" in out
    assert "--accept-new-host-keys" in out
    assert lcli.runs() == []


def test_accepting_a_new_host_key_records_it(fresh_ssh_lab: SshLab, tmp_path: Path) -> None:
    lab = fresh_ssh_lab
    cli = LabCli(tmp_path / "home", lab)
    s = lab.stranger
    cluster = tmp_path / "stranger.yaml"
    cluster.write_text(
        f"hosts:\n  - name: stranger\n    address: {s.address}\n    port: {s.port}\n"
        f"    identity_file: {lab.identity_file}\n    workdir: {s.workdir}\n"
        f"    python: {sys.executable}\n"
    )
    before = lab.known_hosts.read_text()
    proc = cli.run("doctor", "--cluster", str(cluster), "--accept-new-host-keys")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SHA256:" in proc.stderr
    added = lab.known_hosts.read_text()[len(before) :]
    assert added.startswith(f"[{s.address}]:{s.port} ssh-ed25519 ")
    again = cli.run("doctor", "--cluster", str(cluster))  # now known: no flag needed
    assert again.returncode == 0, again.stdout + again.stderr


def test_changed_host_key_is_always_refused(fresh_ssh_lab: SshLab, tmp_path: Path) -> None:
    lab = fresh_ssh_lab
    cli = LabCli(tmp_path / "home", lab)
    lab.rotate_host_key("node-b")
    cluster = cluster_file(lab, tmp_path)
    for extra in ([], ["--accept-new-host-keys"]):
        proc = cli.run("doctor", "--cluster", str(cluster), *extra)
        assert proc.returncode == 1
        assert "CHANGED" in proc.stdout and "node-b" in proc.stdout


def test_unreachable_and_mismatched_hosts_are_reported_together(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    dead, port = ssh_lab.dead_address
    with socket.socket() as silent:  # accepts TCP connections, never answers SSH
        silent.bind(("127.0.0.6", 0))
        silent.listen()
        silent_port = silent.getsockname()[1]
        cluster = cluster_file(
            ssh_lab,
            tmp_path,
            extra_hosts=(
                f"  - name: dead\n    address: {dead}\n    port: {port}\n"
                f"  - name: silent\n    address: 127.0.0.6\n    port: {silent_port}\n"
            ),
            **{"node-b": "python: /usr/bin/python3"},
        )
        started = time.monotonic()
        # 6 s: four SSH handshakes at once on a loaded 2-core machine took over 3
        proc = lcli.run("doctor", "--cluster", str(cluster), "--connect-timeout", "6")
        took = time.monotonic() - started
    assert proc.returncode == 1
    out = proc.stdout
    assert "dead" in out and "refused" in out
    assert "silent" in out and "no SSH answer" in out
    assert "node-b" in out and "torch" in out
    assert "3 of 4 hosts failed" in out, out
    assert took < 6 + 10, took  # the connect timeout, plus one probe with a torch import


def test_setup_failure_names_the_host_and_its_output(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    cluster = cluster_file(ssh_lab, tmp_path)
    proc = lcli.run("launch", str(JOBS / "setupfail" / "job.yaml"), "--cluster", str(cluster))
    assert proc.returncode == 1
    err = proc.stderr
    assert "setup failed on node-a (exit code 3)" in err
    assert "setup failed on node-b (exit code 3)" in err
    assert "no matching distribution for nonexistent-pkg" in err
    assert lcli.runs() == []


def test_second_sync_sends_nothing(
    ssh_lab: SshLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(ssh_lab.home))
    host = ssh_lab.hosts[0]
    t = SSHTransport(host.alias, host.alias, options=SshOptions(connect_timeout=5))
    root = JOBS / "metrics"
    files = local_files(root, excludes_for(root, []))
    dest = str(host.workdir / f"sync-{tmp_path.name}")
    try:
        first = sync_host(t, sys.executable, files, dest)
        second = sync_host(t, sys.executable, files, dest)
    finally:
        t.close()
    assert first.ok and first.files_sent == len(files) > 0
    assert second.ok and (second.files_sent, second.bytes_sent) == (0, 0)
    assert (Path(dest) / "train.py").read_bytes() == (root / "train.py").read_bytes()


def test_dry_run_opens_no_connection(lcli: LabCli, tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.5", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(
            "hosts:\n"
            f"  - {{name: a, address: 127.0.0.5, port: {port}, slots: 2}}\n"
            f"  - {{name: b, address: 127.0.0.5, port: {port + 1}, slots: 2}}\n"
        )
        job = tmp_path / "job.yaml"
        (tmp_path / "train.py").write_text("print(1)\n")
        job.write_text("script: train.py\nenv:\n  WANDB_API_KEY: secret-value\n")
        proc = lcli.run("launch", str(job), "--cluster", str(cluster), "--dry-run")
        assert proc.returncode == 0, proc.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert "host a — 127.0.0.5 over SSH" in proc.stdout
    assert "host b — 127.0.0.5 over SSH" in proc.stdout
    assert "-m dmlctl.agent.torchrun" in proc.stdout
    assert "WANDB_API_KEY=***" in proc.stdout and "secret-value" not in proc.stdout
    assert lcli.runs() == []


def test_dropped_connection_stops_the_hosts_processes(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    """Killing the server side of the SSH connections (what a dropped network does to
    sshd) makes each host agent stop its own processes; the secret env value never
    shows on any command line."""
    secret = "s3cr3t-value-never-on-a-command-line"
    job = tmp_path / "job.yaml"
    job.write_text(
        f"script: {FOREVER / 'train.py'}\nworkdir: {FOREVER}\nworkers: 4\n"
        f"env:\n  MY_API_TOKEN: {secret}\n"
        "restart:\n  max_infra_restarts: 0\n"  # this test checks the failure, not a restart
    )
    cluster = cluster_file(ssh_lab, tmp_path)
    proc = lcli.popen("launch", str(job), "--cluster", str(cluster), "--ui", "quiet")
    try:
        run_id = _wait_running(lcli)
        pids = run_processes(run_id)
        assert not [p for p in pids if secret in cmdline(p)]
        # What each session's sshd runs: the agent's starter (dmlctl.agent.served,
        # which the agent server's agent watches), or the agent itself
        started = [p for p in pids if "dmlctl.agent" in cmdline(p)]
        sessions = {parent(p) for p in started if "sshd" in cmdline(parent(p))}
        assert len(sessions) == 2
        for session in sessions:
            os.kill(session, signal.SIGKILL)
        assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)
        assert proc.wait(30) == 1  # the controller reports the lost hosts
        cause = lcli.state(run_id)["root_cause"]
        assert cause is not None and cause["host"] in ("node-a", "node-b")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _server_socket(lab: SshLab, host: SshHost) -> str:
    """The socket of the agent server that ``host``'s agents come from, as the host
    works it out in a session of its own (:mod:`dmlctl.agent.ask`), for the dmlctl a
    launch shipped there (the one its agents import)."""
    (lib,) = (host.workdir / ".dmlctl" / "lib").iterdir()
    where = (
        "import os, sys; from dmlctl.agent import ask; env = dict(os.environ); "
        "print(ask.runtime_dir(env) / f'agent-{ask.server_key(sys.executable, env)}.sock')"
    )
    command = f"cd {shlex.quote(str(lib))} && " + shlex.join([sys.executable, "-c", where])
    argv = ["ssh", "-F", str(lab.config_file), host.alias, command]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip()


def _answers(sock: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        return s.connect_ex(sock) == 0


def _short_name(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    return raw[raw.index("(") + 1 : raw.rindex(")")]


def test_an_ssh_hosts_agents_come_from_its_agent_server_and_end_with_their_starters(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    """Once a host's agent server runs (a first start there makes one), each agent over
    SSH is forked by it — ``-m dmlctl.agent --run-id RUN``, the server its parent —
    and waited for by its starter in the SSH session (``-m dmlctl.agent.served``).
    A kill -9 of a starter stops its agent and ranks, as a closed channel does, and
    the controller sees that host's agent gone."""
    cluster = cluster_file(ssh_lab, tmp_path, **{h.alias: "slots: 1" for h in ssh_lab.hosts})
    first = lcli.run("launch", str(JOBS / "sleepy" / "job.yaml"), "--cluster", str(cluster))
    assert first.returncode == 0, first.stdout + first.stderr
    for host in ssh_lab.hosts:
        sock = _server_socket(ssh_lab, host)
        assert wait_until(lambda: _answers(sock), 60), f"no agent server at {sock}"  # noqa: B023
    job = tmp_path / "job.yaml"
    job.write_text(
        f"script: {FOREVER / 'train.py'}\nworkdir: {FOREVER}\nworkers: 2\n"
        "restart:\n  max_infra_restarts: 0\n"
    )
    cli = LabCli(tmp_path / "home-2", ssh_lab)  # its run the only one there
    proc = cli.popen("launch", str(job), "--cluster", str(cluster), "--ui", "quiet")
    try:
        run_id = _wait_running(cli)
        pids = run_processes(run_id)
        agents = [p for p in pids if f"-m dmlctl.agent --run-id {run_id}" in cmdline(p)]
        agents = [p for p in agents if _short_name(parent(p)) == "dmlctl-server"]
        starters = [p for p in pids if f"-m dmlctl.agent.served --run-id {run_id}" in cmdline(p)]
        assert len(agents) == 2 and len(starters) == 2, [cmdline(p) for p in pids]
        node_a = str(ssh_lab.hosts[0].workdir)
        starter = next(p for p in starters if os.readlink(f"/proc/{p}/cwd").startswith(node_a))
        agent = next(p for p in agents if os.readlink(f"/proc/{p}/cwd").startswith(node_a))
        below = [p for p in pids if _under(p, agent)]
        assert len(below) >= 3, below  # the agent, its torchrun and rank
        os.kill(starter, signal.SIGKILL)
        assert wait_until(lambda: not set(below) & set(run_processes(run_id)), 15), [
            cmdline(p) for p in set(below) & set(run_processes(run_id))
        ]
        assert proc.wait(60) == 1  # no restart allowed: the run fails
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


def test_kill_9_of_a_remote_host_agent_leaves_no_rank_and_the_run_resumes(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    """A host agent over SSH dies without a word: its torchrun and ranks end with it on
    that host (the parent-death chain), and the run resumes from its checkpoint."""
    resume = Path(__file__).parent.parent / "integration" / "jobs" / "resume"
    job = tmp_path / "agentkill.yaml"
    job.write_text(
        f"name: agentkill\nscript: train.py\nworkdir: {resume}\nworkers: 2\n"
        f"env:\n  STEP_SLEEP: '0.3'\n  OUT: {tmp_path / 'out.pt'}\n"
        "restart:\n  max_infra_restarts: 1\n  backoff_initial: 0.2\n"
        "checkpoint:\n  every_steps: 5\n"
    )
    cluster = cluster_file(ssh_lab, tmp_path, **{h.alias: "slots: 1" for h in ssh_lab.hosts})
    proc = lcli.popen("launch", str(job), "--cluster", str(cluster), "--ui", "plain")
    try:
        run_id = _wait_running(lcli)
        assert wait_until(lambda: _steps(lcli, run_id) >= 6, 60), "no checkpoint yet"
        # The agents (forked by the hosts' agent server), not the starters that wait
        # for them (``-m dmlctl.agent.served``): a starter's kill is another test's.
        forked = [p for p in run_processes(run_id) if "-m dmlctl.agent " in cmdline(p)]
        agents = [p for p in forked if parent(p) not in forked]
        node_b = str(ssh_lab.hosts[1].workdir)
        victim = next(a for a in agents if os.readlink(f"/proc/{a}/cwd").startswith(node_b))
        on_b = [p for p in run_processes(run_id) if _under(p, victim) and p != victim]
        assert len(on_b) >= 2, on_b  # torchrun and its rank
        os.kill(victim, signal.SIGKILL)
        assert wait_until(lambda: not set(on_b) & set(run_processes(run_id)), 2), [
            cmdline(p) for p in set(on_b) & set(run_processes(run_id))
        ]
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    starts = [int(x.split()[0]) for x in out.split("attempt 2 starts at step ")[1:]]
    assert len(starts) == 2 and min(starts) >= 5, out  # from the checkpoint
    state = lcli.state(run_id)
    assert (state["phase"], state["restarts"]) == ("succeeded", 1), state
    # the hosts' last processes end as their SSH sessions close (as in the other tests)
    assert wait_until(lambda: not run_processes(run_id), 15), run_processes(run_id)


def _steps(cli: Cli, run_id: str) -> int:
    """The fewest steps any rank of ``run_id`` has logged."""
    return min((r.get("step") or 0) for r in cli.state(run_id)["ranks"])


def _under(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` is ``pid`` or one of its parents (False once it is gone)."""
    try:
        while pid > 1:
            if pid == ancestor:
                return True
            pid = parent(pid)
    except OSError:
        pass
    return False


def test_proxyjump_alias_from_ssh_config(lcli: LabCli, ssh_lab: SshLab, tmp_path: Path) -> None:
    a = ssh_lab.hosts[0]
    cluster = tmp_path / "jump.yaml"
    cluster.write_text(
        "hosts:\n  - name: a-via-b\n    address: node-a-via-b\n"
        f"    workdir: {a.workdir}\n    python: {sys.executable}\n"
    )
    proc = lcli.run("doctor", "--cluster", str(cluster))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the host is ready" in proc.stdout


def test_hostfile_is_a_cluster(lcli: LabCli, ssh_lab: SshLab, tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# DeepSpeed style\nnode-a slots=1\nnode-b slots=1\n")
    proc = lcli.run(
        "launch",
        str(JOBS / "metrics" / "job.yaml"),
        "--cluster",
        str(hostfile),
        "--workers",
        "2",
        "--dry-run",
    )
    assert proc.returncode == 0, proc.stderr
    assert "host node-a — node-a over SSH" in proc.stdout
    assert "host node-b — node-b over SSH" in proc.stdout


def test_logs_fetch_reads_the_files_kept_on_the_hosts(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    cluster = cluster_file(ssh_lab, tmp_path)
    proc = lcli.run(
        "launch", str(JOBS / "metrics" / "job.yaml"), "--cluster", str(cluster), "--ui", "quiet"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = only_run(lcli)
    collected = lcli.home / "runs" / run_id / "hosts"
    for f in collected.glob("*/rank-*"):
        f.unlink()  # as if the collection at the end had failed
    fetched = lcli.run("logs", run_id, "--fetch")
    assert fetched.returncode == 0, fetched.stderr
    for rank in range(4):
        assert f"[rank {rank}] rank {rank} of 4" in fetched.stdout
    one = lcli.run("logs", run_id, "--fetch", "--rank", "2")
    assert one.stdout.startswith("rank 2 of 4")


def test_a_failing_rank_stops_the_other_hosts_at_once(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    cluster = cluster_file(ssh_lab, tmp_path)
    started = time.monotonic()
    proc = lcli.run(
        "launch",
        str(JOBS / "failhang" / "job.yaml"),
        "--cluster",
        str(cluster),
        "--ui",
        "plain",
        timeout=120,
    )
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_id = only_run(lcli)
    cause = lcli.state(run_id)["root_cause"]
    assert (cause["rank"], cause["exc_type"]) == (1, "RuntimeError")
    assert cause["message"] == "loss is NaN at step 3"
    assert "RuntimeError: loss is NaN at step 3" in proc.stdout
    assert took < 60, took  # not gloo's 30-minute collective timeout
    assert not run_processes(run_id)


def test_doctor_passes_on_hosts_named_by_ssh_config_aliases(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    proc = lcli.run("doctor", "--cluster", str(cluster_file(ssh_lab, tmp_path)), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert (report["ok"], report["total"], report["failed"]) == (True, 2, 0)


def test_doctor_reads_a_hostfile_like_launch_does(lcli: LabCli, tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\n")
    proc = lcli.run("doctor", "--cluster", str(hostfile), "--json")
    assert proc.returncode in (0, 1), proc.stderr  # checked, not refused as bad YAML
    assert json.loads(proc.stdout)["hosts"][0]["host"] == "node-a"


def test_parameter_server_on_a_dedicated_host(
    lcli: LabCli, ssh_lab: SshLab, tmp_path: Path
) -> None:
    """Two workers on node-a, their parameter server alone on node-b (server_hosts):
    roles found across hosts after the rendezvous, pushes and pulls over the network."""
    example = Path(__file__).resolve().parents[2] / "examples" / "parameter-server"
    job = tmp_path / "ps.yaml"
    job.write_text(
        f"name: ps\nworkdir: {example}\nscript: train.py\nargs: ['--epochs', '1']\n"
        "workers: 2\nparameter_servers: 1\nserver_hosts: [node-b]\n"
        "strategy:\n  name: ssp\n  params: {staleness: 2}\n"
    )
    cluster = cluster_file(ssh_lab, tmp_path)
    proc = lcli.run("launch", str(job), "--cluster", str(cluster), "--ui", "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = only_run(lcli)
    state = lcli.state(run_id)
    placed = sorted((r["host"], r["role"]) for r in state["ranks"])
    assert placed == [("node-a", "worker"), ("node-a", "worker"), ("node-b", "server")]
    records = [
        json.loads(x)
        for x in (lcli.home / "runs" / run_id / "metrics.jsonl").read_text().splitlines()
    ]
    served = [r for r in records if r["host"] == "node-b" and "max_lead" in r["values"]]
    assert served and all(r["values"]["max_lead"] <= 2 for r in served)
    final = [r["values"] for r in records if "test_acc" in r["values"]]
    assert final and final[-1]["test_acc"] >= 0.9, final
    assert not run_processes(run_id)
