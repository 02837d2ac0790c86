"""The SSH library's own logging never reaches the terminal: a host that answers with
something other than SSH makes paramiko log its traceback line by line; dmlctl's one
line per host says what is wrong, and paramiko's lines go to ``$DMLCTL_HOME/ssh.log``."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cli


@pytest.fixture
def not_ssh() -> Iterator[int]:
    """A port that greets every connection with something other than SSH, then hangs up."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"not ssh at all\r\n" * 3)

    threading.Thread(target=serve, daemon=True).start()
    yield int(server.getsockname()[1])
    server.close()


def test_a_host_that_does_not_speak_ssh_gets_one_line_and_the_library_log_a_file(
    cli: Cli, tmp_path: Path, not_ssh: int
) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"hosts:\n  - {{name: odd, address: 127.0.0.1, port: {not_ssh}}}\n")
    proc = cli.run("doctor", "--cluster", str(cluster), "--connect-timeout", "5", timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == "" and "Traceback" not in proc.stdout, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("odd ")]
    assert f"127.0.0.1:{not_ssh}" in line
    log = (cli.home / "ssh.log").read_text()
    assert "paramiko.transport ERROR" in log and "SSH protocol banner" in log
    assert (cli.home / "ssh.log").stat().st_mode & 0o777 == 0o600
