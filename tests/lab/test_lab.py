"""``dmlctl lab``: real namespaces, veth pairs, a bridge, tbf shaping and sshd.

Up then down leaves nothing behind; a shaped link carries a bulk transfer within 20 %
of its rate; ``dmlctl launch`` runs a real job over the lab's SSH hosts."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.lab.conftest import LabCli, lab_cli

pytestmark = pytest.mark.integration

RATE_BITS = 20_000_000  # the shared lab's --bandwidth 20mbit


def _leftovers() -> list[str]:
    out = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += [line for line in netns.splitlines() if line.startswith("dmlctl-lab-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    out += [line.split(":")[1].strip() for line in links.splitlines() if "dml" in line]
    procs = subprocess.run(["pgrep", "-af", "dmlctl/lab/hosts"], capture_output=True, text=True)
    out += procs.stdout.splitlines()
    return out


def test_up_twice_then_down_leaves_nothing(tmp_path: Path) -> None:
    cli = lab_cli(tmp_path)
    cli.known_hosts.parent.mkdir(parents=True)
    cli.known_hosts.write_text("other.example ssh-ed25519 AAAAkeep\n")
    for _ in range(2):  # the second up removes the first lab
        proc = cli.run("lab", "up", "--hosts", "2", "--bandwidth", "50mbit")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lab up: 2 hosts at 50mbit each way" in proc.stdout
    assert len(_leftovers()) >= 4  # 2 namespaces, the bridge, 2 veths, 2 sshd
    status = cli.run("lab", "status")
    assert status.returncode == 0 and status.stdout.count("sshd answers") == 2, status.stdout
    other = lab_cli(tmp_path / "other")  # another DMLCTL_HOME: its up would cut this lab off
    refused = other.run("lab", "up", "--hosts", "1")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"a lab made for {cli.lab_dir} is up; `dmlctl lab down` removes it" in refused.stderr
    trusted = cli.known_hosts.read_text()
    assert "10.231.0.2 ssh-ed25519" in trusted and "other.example" in trusted
    before = Path("/etc/hosts").read_text()  # the lab's addresses have names
    assert socket.gethostbyaddr("10.231.0.2")[0] == "dmlctl-lab-0"
    assert socket.gethostbyaddr("10.231.0.1")[0] == "dmlctl-lab-gateway"
    assert socket.getnameinfo(("::ffff:10.231.0.2", 22, 0, 0), 0)[0] == "dmlctl-lab-0"
    down = cli.run("lab", "down")
    assert down.returncode == 0, down.stderr
    assert "removed namespace dmlctl-lab-0 (1 process stopped)" in down.stdout
    assert _leftovers() == []
    assert cli.known_hosts.read_text() == "other.example ssh-ed25519 AAAAkeep\n"
    assert "dmlctl-lab" not in Path("/etc/hosts").read_text() and "dmlctl-lab-0" in before
    assert not cli.lab_dir.exists()
    again = cli.run("lab", "down")
    assert again.returncode == 0 and again.stdout.strip() == "no lab to remove"


def test_bad_options_are_one_line_and_exit_2(tmp_path: Path) -> None:
    cli = lab_cli(tmp_path)
    for args, message in (
        (["--bandwidth", "fast"], "--bandwidth 'fast': expected a rate such as 100mbit"),
        (["--hosts", "0"], "--hosts 0: a lab has 1 to 64 hosts"),
        (["--latency", "5"], "--latency '5': expected a delay such as 5ms"),
    ):
        proc = cli.run("lab", "up", *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"dmlctl: {message}"), proc.stderr
    assert _leftovers() == []


SENDER = textwrap.dedent(
    """
    import socket, sys
    c = socket.create_connection((sys.argv[1], 5201))
    c.sendall(b"x" * int(sys.argv[2]))
    c.close()
    """
)
RECEIVER = textwrap.dedent(
    """
    import socket, sys, time
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 5201))
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    got, start = 0, None
    while chunk := c.recv(1 << 16):
        start = start or time.perf_counter()
        got += len(chunk)
    print(got, time.perf_counter() - start, flush=True)
    """
)


def test_a_shaped_link_carries_a_bulk_transfer_within_20_percent_of_its_rate(
    lab: LabCli,
) -> None:
    size = 3_000_000  # 1.2 s at 20 Mbit/s
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", "dmlctl-lab-1", sys.executable, "-c", RECEIVER, "10.231.0.3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
    sender = ["ip", "netns", "exec", "dmlctl-lab-0", sys.executable, "-c", SENDER]
    subprocess.run([*sender, "10.231.0.3", str(size)], check=True, timeout=60)
    got, seconds = receiver.communicate(timeout=60)[0].split()
    rate = int(got) * 8 / float(seconds)
    print(f"measured {rate / 1e6:.1f} Mbit/s on a 20mbit lab link")
    assert int(got) == size
    assert 0.8 * RATE_BITS <= rate <= 1.2 * RATE_BITS, rate


def test_launch_runs_a_job_over_the_labs_ssh_hosts(lab: LabCli) -> None:
    cluster = lab.lab_dir / "cluster.yaml"
    started = time.monotonic()
    proc = lab.run(
        "launch",
        str(REPO / "tests" / "integration" / "jobs" / "plain" / "job.yaml"),
        "--cluster",
        str(cluster),
        "--ui",
        "plain",
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("sum=3") == 2, proc.stdout
    assert "MASTER_ADDR=10.231.0.1" in proc.stdout  # the run's store: the controller's
    # torch finds a name for every peer's address: no warning in any rank's log
    assert "hostname of the client socket cannot be retrieved" not in proc.stdout
    assert time.monotonic() - started < 120


def test_a_lab_host_outside_the_cluster_cannot_reach_the_runs_store(
    lab: LabCli, tmp_path: Path
) -> None:
    """The cluster is lab-0 alone; lab-1 (another address of the same network) connects
    to the run's store while the run goes on: closed before a byte of it is read (so
    no pickled object can be written there), named in the run's log; the run succeeds."""
    doc = yaml.safe_load((lab.lab_dir / "cluster.yaml").read_text())
    doc["hosts"] = doc["hosts"][:1]
    cluster = tmp_path / "one.yaml"
    cluster.write_text(yaml.safe_dump(doc))
    go_on = tmp_path / "go-on"
    job = tmp_path / "job.yaml"
    job.write_text(
        f"script: train.py\nworkdir: {REPO / 'tests' / 'lab' / 'jobs' / 'outsider'}\n"
        f"workers: 1\nenv: {{GO_ON: '{go_on}'}}\n"
    )
    proc = lab.popen("launch", str(job), "--cluster", str(cluster), "--ui", "plain")
    assert proc.stdout is not None
    try:
        seen = ""
        while (line := proc.stdout.readline()) and "store at" not in line:
            seen += line
        assert "store at" in line, seen
        host, port = line.split("store at ", 1)[1].split()[:2]
        assert host == "10.231.0.1", line
        probe = (
            "import socket, struct\n"
            f"s = socket.create_connection(({host!r}, {port}), timeout=10)\n"
            "try:\n"
            "    s.sendall(bytes([15]) + struct.pack('<I', 0x3C85F7CE))\n"
            "    print('read', s.recv(1))\n"
            "except OSError:\n"
            "    print('reset')\n"
        )
        outside = subprocess.run(
            ["ip", "netns", "exec", "dmlctl-lab-1", sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert outside.stdout.strip() in ("read b''", "reset"), outside
        go_on.touch()
        out = seen + line + proc.communicate(timeout=120)[0]
    finally:
        go_on.touch()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    run = max(lab.runs(), key=lambda p: p.stat().st_mtime)  # the module's lab: its own
    logs = (run / "logs" / "merged.log").read_text() + out
    assert "the run's store closed a connection from 10.231.0.3" in logs, logs
