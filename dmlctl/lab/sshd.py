"""One ``sshd`` per lab host, in the host's namespace, with throw-away keys: a host
key each and one user key every host accepts. Files under the lab directory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from dmlctl.lab.net import LabError, address, namespace

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
READY_TIMEOUT_S = 15.0
USER_KEY = "id_ed25519"


def require_tools() -> None:
    """LabError naming what is missing: root, iproute2, tc, openssh-server, ssh-keygen."""
    if os.geteuid() != 0:
        raise LabError("dmlctl lab needs root (network namespaces and tc)")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            raise LabError(f"dmlctl lab needs `{tool}`: install {package}")
    if not SSHD.is_file():
        raise LabError(f"dmlctl lab needs {SSHD}: install openssh-server")


def keygen(path: Path, comment: str) -> None:
    """A new ed25519 key pair at ``path`` and ``path.pub``."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def host_dir(lab_dir: Path, i: int) -> Path:
    return lab_dir / "hosts" / f"lab-{i}"


def write_config(lab_dir: Path, i: int) -> Path:
    """Host ``i``'s key and ``sshd_config`` (listening on its address only, the lab's
    user key only); the config's path."""
    d = host_dir(lab_dir, i)
    (d / "work").mkdir(parents=True, exist_ok=True)
    keygen(d / "ssh_host_ed25519_key", f"dmlctl-lab-{i}")
    config = d / "sshd_config"
    config.write_text(
        sshd_config(
            f"{address(i)}:22",
            d / "ssh_host_ed25519_key",
            d / "sshd.pid",
            lab_dir / (USER_KEY + ".pub"),
        )
    )
    return config


def sshd_config(
    listen: str,
    host_key: Path,
    pid_file: Path,
    authorized_keys: Path,
    env: Mapping[str, str] | None = None,
) -> str:
    """An ``sshd_config`` for a throw-away host: listening on ``listen`` only, keys only
    (``authorized_keys``, root allowed), no PAM, SFTP built in (fabric's put/get speak
    it), room for many sessions; errors only in its log. The SSH test lab uses it too.

    Sessions start with ``SHLVL=1``, so bash does not source this machine's
    ``~/.bashrc`` as it does for a command from sshd: a throw-away host runs the
    commands it is sent and nothing of the machine's own shell set-up, and a host killed
    while that set-up held a lock (pyenv's rehash does) cannot make every later session
    wait for it. ``env``: more variables every session starts with.
    """
    set_env = " ".join(f"{k}={v}" for k, v in {"SHLVL": "1", **(env or {})}.items())
    lines = [
        f"ListenAddress {listen}",
        f"HostKey {host_key}",
        f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "StrictModes no",
        "UsePAM no",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        "PrintMotd no",
        "MaxSessions 50",
        "MaxStartups 50:30:100",
        "LogLevel ERROR",
        "Subsystem sftp internal-sftp",
        f"SetEnv {set_env}",  # one line: sshd keeps a keyword's first value
    ]
    return "\n".join(lines) + "\n"


def start(lab_dir: Path, i: int) -> int:
    """``sshd -D`` of host ``i`` inside its namespace, detached from this process (it
    outlives ``lab up``); its pid."""
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    d = host_dir(lab_dir, i)
    log = d / "sshd.log"
    argv = ["ip", "netns", "exec", namespace(i), str(SSHD), "-D", "-f", str(d / "sshd_config")]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*argv, "-E", str(log)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def wait_ready(lab_dir: Path, i: int, pid: int) -> None:
    """Return once host ``i`` answers with an ``SSH-2.0-`` banner; LabError with the
    log's tail if its sshd exits or stays silent for :data:`READY_TIMEOUT_S`."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if _banner(address(i)):
            return
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    log = host_dir(lab_dir, i) / "sshd.log"
    tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
    raise LabError(f"sshd of lab-{i} did not come up: {' | '.join(tail) or 'no output'}")


def answers(host: str) -> bool:
    """Whether ``host``:22 sends an SSH banner within a second."""
    return _banner(host)


def _banner(host: str) -> bool:
    try:
        with socket.create_connection((host, 22), timeout=1.0) as s:
            s.settimeout(1.0)
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def known_hosts_line(lab_dir: Path, i: int) -> str:
    """Host ``i``'s known_hosts line (port 22: the bare address)."""
    pub = (host_dir(lab_dir, i) / "ssh_host_ed25519_key.pub").read_text().split()
    return f"{address(i)} {pub[0]} {pub[1]}"
