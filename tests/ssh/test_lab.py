"""The SSH lab itself: trusted hosts log in, untrusted or changed keys are refused,
ProxyJump works and the dead address refuses at once."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tests.ssh.lab import SshLab

pytestmark = pytest.mark.ssh


def ssh(lab: SshLab, alias: str, *command: str) -> subprocess.CompletedProcess[str]:
    """OpenSSH with the lab's client config, never prompting."""
    return subprocess.run(
        ["ssh", "-F", str(lab.config_file), "-o", "BatchMode=yes", alias, *command],
        env=lab.env(),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def test_lab_layout(ssh_lab: SshLab) -> None:
    addresses = [h.address for h in ssh_lab.hosts]
    assert addresses == ["127.0.0.2", "127.0.0.3"]
    assert [h.alias for h in ssh_lab.hosts] == ["node-a", "node-b"]
    assert ssh_lab.stranger.address not in addresses
    assert len({h.workdir for h in [*ssh_lab.hosts, ssh_lab.stranger]}) == 3
    assert all(h.port != 22 for h in ssh_lab.hosts)
    ssh_dir = ssh_lab.home / ".ssh"
    assert {p.name for p in ssh_dir.iterdir()} >= {
        "config",
        "known_hosts",
        "id_ed25519",
        "id_ed25519.pub",
    }
    known = ssh_lab.known_hosts.read_text()
    for h in ssh_lab.hosts:
        assert f"[{h.address}]:{h.port} ssh-ed25519 AAAA" in known
    assert f"[{ssh_lab.stranger.address}]:{ssh_lab.stranger.port}" not in known
    assert ssh_lab.env(FOO="1")["HOME"] == str(ssh_lab.home)


@pytest.mark.parametrize("alias", ["node-a", "node-b"])
def test_trusted_host_runs_a_command(ssh_lab: SshLab, alias: str) -> None:
    host = ssh_lab.host(alias)
    result = ssh(ssh_lab, alias, "true")
    assert result.returncode == 0, result.stderr
    result = ssh(ssh_lab, alias, f"cd {host.workdir} && pwd && whoami")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(host.workdir), ssh_lab.user]


def test_stranger_fails_host_key_verification(ssh_lab: SshLab) -> None:
    result = ssh(ssh_lab, "stranger", "true")
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr
    assert "No ED25519 host key is known" in result.stderr


def test_proxy_jump_alias(ssh_lab: SshLab) -> None:
    result = ssh(ssh_lab, "node-a-via-b", "echo", "jumped")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "jumped\n"


def test_dead_address_refuses_quickly(ssh_lab: SshLab) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(ssh_lab.dead_address, timeout=5).close()
    assert time.monotonic() - started < 1.0


def test_rotated_host_key_is_reported_changed(fresh_ssh_lab: SshLab) -> None:
    assert ssh(fresh_ssh_lab, "node-b", "true").returncode == 0
    fresh_ssh_lab.rotate_host_key("node-b")
    result = ssh(fresh_ssh_lab, "node-b", "true")
    assert result.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr
    assert "Host key verification failed" in result.stderr
    assert ssh(fresh_ssh_lab, "node-a", "true").returncode == 0


def test_stop_leaves_nothing_listening(fresh_ssh_lab: SshLab) -> None:
    fresh_ssh_lab.stop()
    for h in [*fresh_ssh_lab.hosts, fresh_ssh_lab.stranger]:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((h.address, h.port), timeout=5).close()
    fresh_ssh_lab.stop()  # idempotent
