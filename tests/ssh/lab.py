"""A throw-away lab of real ``sshd`` hosts on loopback addresses, for SSH tests.

``start_lab(root, n)`` starts ``n`` OpenSSH servers on 127.0.0.2, 127.0.0.3, ... (each on
its own free port, with its own config, ed25519 host key, pid file, log and work
directory), plus one *stranger* server whose host key is deliberately absent from
``known_hosts``, and picks a *dead* address on which nothing listens. It writes a fake
HOME whose ``.ssh/`` holds a client config, a ``known_hosts`` and the user key the
servers accept, so that both OpenSSH (``ssh -F lab.config_file ...``) and paramiko/fabric
(``HOME=lab.home``) reach the hosts without touching the real user's files.

Guarantees:

* ``start_lab`` returns only once every server answers with an ``SSH-2.0-`` banner
  (polled, ~10 s deadline per server); otherwise it stops what it started and raises
  :class:`LabError` carrying the server's log tail.
* Every process the lab starts is a child of this process and is stopped by
  :meth:`SshLab.stop` (idempotent, also registered with :mod:`atexit`), together with
  any per-connection ``sshd`` process and remote command still alive below it.

Works as root (the servers need the privilege-separation directory ``/run/sshd``,
which is created when missing). Linux only: every ``127.0.0.0/8`` address is local.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import signal
import socket
import string
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dmlctl.lab.sshd import sshd_config
from tests.integration.procs import cmdline

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")
READY_TIMEOUT_S = 10.0
_START_ATTEMPTS = 3  # a probed free port can be taken before sshd binds it: retry


class LabError(RuntimeError):
    """The lab could not be set up: a server did not come up, a tool is missing, ..."""


@dataclass(frozen=True)
class SshHost:
    """One running ``sshd`` of the lab.

    ``alias`` is its ``Host`` name in the lab's client config; ``workdir`` is a
    directory of its own (all hosts share this machine's filesystem).
    """

    alias: str
    address: str
    port: int
    workdir: Path


@dataclass
class _Server:
    """What the lab needs to (re)start and stop one ``sshd``."""

    host: SshHost
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"


class SshLab:
    """A set of running loopback ``sshd`` servers and the client files that reach them.

    Attributes:
        root: the directory holding every file of the lab.
        home: a fake HOME; ``home/.ssh/`` holds ``config``, ``known_hosts``,
            ``id_ed25519`` and ``id_ed25519.pub``.
        user: the login user on every host (the current user).
        identity_file: the private key every host accepts.
        known_hosts: lists the host key of every host of ``hosts`` (as
            ``[address]:port``), and not the stranger's.
        hosts: the trusted hosts, aliases ``node-a``, ``node-b``, ...
        stranger: a running host (alias ``stranger``) whose key is not trusted.
        dead_address: ``(address, port)`` on which nothing listens: connecting is
            refused at once.

    The client config also defines ``node-a-via-b`` (node-a reached with
    ``ProxyJump node-b``) when there are at least two hosts.
    """

    def __init__(
        self,
        root: Path,
        user: str,
        servers: list[_Server],
        stranger: _Server,
        dead_address: tuple[str, int],
    ) -> None:
        self.root = root
        self.home = root / "home"
        self.user = user
        self.identity_file = self.home / ".ssh" / "id_ed25519"
        self.known_hosts = self.home / ".ssh" / "known_hosts"
        self.dead_address = dead_address
        self._servers = {s.host.alias: s for s in [*servers, stranger]}
        self.hosts = [s.host for s in servers]
        self.stranger = stranger.host

    @property
    def config_file(self) -> Path:
        """The client config to pass as ``ssh -F``: OpenSSH finds ``~`` from the
        password database, not from ``$HOME``, so ``env()`` alone does not reach it."""
        return self.home / ".ssh" / "config"

    def host(self, alias: str) -> SshHost:
        """The host (trusted or the stranger) named ``alias``; KeyError lists the names."""
        return self._server(alias).host

    def _server(self, alias: str) -> _Server:
        try:
            return self._servers[alias]
        except KeyError:
            raise KeyError(f"no lab host {alias!r}; hosts: {sorted(self._servers)}") from None

    def env(self, **extra: str) -> dict[str, str]:
        """``os.environ`` with ``HOME`` set to the lab's home, then ``extra``.

        ``SSH_AUTH_SOCK`` is dropped so that no agent of the real user can log in
        in the lab key's stead.
        """
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env["HOME"] = str(self.home)
        env.update(extra)
        return env

    def rotate_host_key(self, alias: str) -> None:
        """Give ``alias``'s server a new host key and restart it; returns when it is
        ready again. ``known_hosts`` is left alone, so it now holds a *changed* key."""
        server = self._server(alias)
        _stop_server(server)
        server.host_key.unlink(missing_ok=True)
        server.host_key.with_suffix(".pub").unlink(missing_ok=True)
        _keygen([server.host_key], comment=f"dmlctl-lab-{alias}")
        _spawn(server)
        _wait_ready([server])

    def kill_host(self, alias: str) -> None:
        """``alias`` dies as a machine does: its sshd and every process below it (the
        host agent, torchrun, the ranks) get SIGKILL at once; returns when they are gone."""
        server = self._server(alias)
        proc, server.proc = server.proc, None
        if proc is None:
            return
        doomed = [proc.pid, *_descendants(proc.pid)]
        for pid in doomed:  # a frozen host dies too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
        rehashing = any("pyenv-rehash" in cmdline(pid) for pid in doomed)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=5)
        if rehashing:
            # The lab's hosts share this machine's home: a login shell killed inside
            # ``pyenv rehash`` (run by ~/.bashrc) leaves pyenv's lock behind, and every
            # later session would wait on it. A machine that really died takes it along.
            root = Path(
                os.environ.get("PYENV_ROOT", Path(pwd.getpwuid(os.getuid()).pw_dir, ".pyenv"))
            )
            (root / "shims" / ".pyenv-shim").unlink(missing_ok=True)

    def freeze_host(self, alias: str) -> list[int]:
        """``alias`` stops answering without closing a connection, as a host cut off
        from the network does: its sshd and every process below it get SIGSTOP.
        Returns the stopped pids (``kill_host`` ends them). A ``pyenv rehash`` run by a
        login shell is left to finish: its lock is shared with the other lab hosts."""
        server = self._server(alias)
        if server.proc is None:
            return []
        frozen = [
            pid
            for pid in [server.proc.pid, *_descendants(server.proc.pid)]
            if "pyenv" not in cmdline(pid)
        ]
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        return frozen

    def revive_host(self, alias: str) -> None:
        """Start ``alias``'s sshd again (same address, port and keys); returns when ready."""
        server = self._server(alias)
        if server.proc is None:
            _spawn(server)
            _wait_ready([server])

    def stop(self) -> None:
        """Stop every server and kill whatever still runs below them. Idempotent."""
        atexit.unregister(self.stop)
        for server in self._servers.values():
            _stop_server(server)

    def __enter__(self) -> SshLab:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


SILENCE_S = 6
"""The ``host_timeout`` of the tests that freeze a host (SSH and Slurm labs): long
enough that a healthy host's agent (a keepalive every second) never falls that silent
on a loaded 2-core machine, so they run beside the rest of the suite."""


def start_lab(root: Path, n_hosts: int = 2, agent_server_idle: float = 60.0) -> SshLab:
    """Start ``n_hosts`` trusted servers and a stranger under ``root`` (created if
    needed; use an empty directory) and return the ready lab. See the module doc.

    The hosts' sessions have ``DMLCTL_AGENT_SERVER_IDLE=agent_server_idle``: their
    agents come from one agent server (they share this machine), which leaves a minute
    after the last; 0 starts every agent below its host's ``sshd``, as a lab whose hosts
    get killed needs (an agent server is no host's)."""
    if not 1 <= n_hosts <= 26:
        raise ValueError(f"n_hosts must be between 1 and 26, got {n_hosts}")
    if not SSHD.is_file():
        raise LabError(f"{SSHD} not found: install openssh-server")
    _ensure_privsep_dir()
    root = root.resolve()
    home_ssh = root / "home" / ".ssh"
    home_ssh.mkdir(parents=True, mode=0o700)
    user_key = home_ssh / "id_ed25519"

    servers = [
        _new_server(root, f"node-{string.ascii_lowercase[i]}", f"127.0.0.{2 + i}")
        for i in range(n_hosts)
    ]
    stranger = _new_server(root, "stranger", f"127.0.0.{2 + n_hosts}")
    everyone = [*servers, stranger]
    dead_ip = "127.0.0.9" if n_hosts < 7 else f"127.0.0.{3 + n_hosts}"
    dead = (dead_ip, _free_port(dead_ip))

    _keygen([user_key, *(s.host_key for s in everyone)], comment="dmlctl-lab")
    (root / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
    try:
        for s in everyone:
            _write_sshd_config(s, root, agent_server_idle)
            _spawn(s)
        _wait_ready(everyone, root=root)
    except BaseException:
        for s in everyone:
            _stop_server(s)
        raise

    # Ports are final only now: a server may have moved off a port taken meanwhile.
    user = _current_user()
    (home_ssh / "known_hosts").write_text("".join(_known_hosts_line(s) for s in servers))
    (home_ssh / "config").write_text(_client_config(servers, stranger, user, home_ssh))
    (home_ssh / "config").chmod(0o600)
    lab = SshLab(root, user, servers, stranger, dead)
    atexit.register(lab.stop)
    return lab


# -- files ---------------------------------------------------------------------------


def _new_server(root: Path, alias: str, address: str) -> _Server:
    directory = root / "hosts" / alias
    workdir = directory / "work"
    workdir.mkdir(parents=True)
    return _Server(SshHost(alias, address, _free_port(address), workdir), directory)


def _write_sshd_config(server: _Server, root: Path, agent_server_idle: float) -> None:
    h = server.host
    server.config.write_text(
        sshd_config(
            f"{h.address}:{h.port}",
            server.host_key,
            server.dir / "sshd.pid",
            root / "authorized_keys",
            env={"DMLCTL_AGENT_SERVER_IDLE": f"{agent_server_idle:g}"},
        )
    )


def _known_hosts_line(server: _Server) -> str:
    keytype, key = server.host_key.with_suffix(".pub").read_text().split()[:2]
    return f"[{server.host.address}]:{server.host.port} {keytype} {key}\n"


def _client_config(servers: list[_Server], stranger: _Server, user: str, ssh_dir: Path) -> str:
    def block(alias: str, address: str, port: int, *more: str) -> str:
        lines = [
            f"Host {alias}",
            f"    HostName {address}",
            f"    Port {port}",
            f"    User {user}",
            f"    IdentityFile {ssh_dir / 'id_ed25519'}",
            f"    UserKnownHostsFile {ssh_dir / 'known_hosts'}",
            "    StrictHostKeyChecking yes",
            "    IdentitiesOnly yes",
            *(f"    {line}" for line in more),
        ]
        return "\n".join(lines) + "\n\n"

    out = [block(s.host.alias, s.host.address, s.host.port) for s in [*servers, stranger]]
    if len(servers) >= 2:
        a = servers[0].host
        out.append(
            block(f"{a.alias}-via-b", a.address, a.port, f"ProxyJump {servers[1].host.alias}")
        )
    # Defaults for every block above (first match wins): keep the lab hermetic.
    out.append(
        "Host *\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    UpdateHostKeys no\n"
        "    IdentityAgent none\n"
        "    ConnectTimeout 10\n"
    )
    return "".join(out)


def _keygen(paths: list[Path], comment: str) -> None:
    """Generate an unencrypted ed25519 key at each path, concurrently."""
    procs = [
        (
            p,
            subprocess.Popen(
                [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(p)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            ),
        )
        for p in paths
    ]
    for path, proc in procs:
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise LabError(f"ssh-keygen failed for {path}: {out.decode(errors='replace')}")


# -- processes -----------------------------------------------------------------------


def _ensure_privsep_dir() -> None:
    try:
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as e:
        raise LabError(f"sshd needs {PRIVSEP_DIR} and it cannot be created: {e}") from e


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


def _spawn(server: _Server) -> None:
    with server.log.open("ab") as log:
        server.proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(server.config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own group: a Ctrl-C aimed at pytest spares it
        )


def _wait_ready(servers: list[_Server], root: Path | None = None) -> None:
    """Poll every server for its banner. With ``root`` (first start, nothing trusts
    the ports yet) a server that exits because its probed port was taken meanwhile
    is moved to a new free port, up to ``_START_ATTEMPTS`` times."""
    for server in servers:
        for attempt in range(1, _START_ATTEMPTS + 1):
            if _poll_banner(server):
                break
            if server.proc is not None and server.proc.poll() is None:
                raise LabError(_failure(server, f"no SSH banner within {READY_TIMEOUT_S:.0f} s"))
            taken = "Address already in use" in _tail(server.log)
            if root is None or not taken or attempt == _START_ATTEMPTS:
                raise LabError(_failure(server, "sshd exited during startup"))
            h = server.host
            server.host = SshHost(h.alias, h.address, _free_port(h.address), h.workdir)
            _write_sshd_config(server, root)
            _spawn(server)


def _poll_banner(server: _Server) -> bool:
    """True once ``server`` sends an ``SSH-2.0-`` banner; False if it exits or the
    deadline passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    addr = (server.host.address, server.host.port)
    while time.monotonic() < deadline:
        if server.proc is None or server.proc.poll() is not None:
            return False
        # Short timeout: until sshd binds, the port may belong to someone silent.
        with (
            contextlib.suppress(OSError),
            socket.create_connection(addr, timeout=0.25) as sock,
        ):
            if sock.recv(256).startswith(b"SSH-2.0-"):
                return True
        time.sleep(0.01)  # poll interval, not a readiness guess
    return False


def _failure(server: _Server, what: str) -> str:
    h = server.host
    rc = None if server.proc is None else server.proc.poll()
    return (
        f"lab host {h.alias} ({h.address}:{h.port}): {what} (exit status {rc}).\n"
        f"config: {server.config}\nlog tail ({server.log}):\n{_tail(server.log)}"
    )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (sshd's per-connection children call setsid,
    so only the parent links find them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _stop_server(server: _Server) -> None:
    proc, server.proc = server.proc, None
    if proc is None:
        return
    below = _descendants(proc.pid) if proc.poll() is None else []
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
