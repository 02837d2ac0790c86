"""An SSH connection that fails says why, by its real cause, with the time it took:
real connections to loopback ports (nothing listening; a listener that closes at
once), and the socket errors paramiko gathers for a host it cannot reach."""

from __future__ import annotations

import errno
import socket
import threading
from pathlib import Path

import paramiko
import pytest

from dmlctl.transport.base import Command
from dmlctl.transport.ssh import SshOptions, SSHTransport, _describe


@pytest.fixture(autouse=True)
def no_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config, no known_hosts


def _said(port: int, timeout: float = 5.0) -> str:
    transport = SSHTransport("h", "127.0.0.1", port=port, options=SshOptions(timeout))
    try:
        code, _, err = transport.execute(Command(("true",), timeout=timeout))
    finally:
        transport.close()
    assert code == 255
    return err


def test_nothing_listening_is_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    said = _said(port)
    assert said.startswith("connection to ") and f"127.0.0.1:{port} refused" in said, said
    assert "(after 0." in said, said


def test_a_connection_closed_at_once_is_not_called_silence() -> None:
    """It was reported as 'no SSH answer within 10 s' after 1.2 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def close_each() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    try:
        said = _said(port, timeout=10.0)
    finally:
        listener.close()
    assert "closed before SSH's greeting (after " in said, said
    assert "within 10 s" not in said


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (errno.EHOSTUNREACH, "failed: no route to host"),
        (errno.ENETUNREACH, "failed: network unreachable"),
        (errno.ECONNREFUSED, "refused"),
    ],
)
def test_the_socket_error_behind_a_failed_connection_is_named(code: int, cause: str) -> None:
    exc = paramiko.ssh_exception.NoValidConnectionsError(
        {("10.0.0.7", 22): OSError(code, "from the kernel")}
    )
    said = _describe(exc, "u@10.0.0.7:22", 10.0, took=3.04)
    assert said.startswith(f"connection to u@10.0.0.7:22 {cause}") and "(after 3.0 s)" in said
