"""SSHTransport: commands on a remote host over SSH (fabric/paramiko).

The only module (with :mod:`dmlctl.transport.hostkeys`) that imports fabric or
paramiko. Promises:

* host names, users, ports, identity files and ProxyJump from the user's
  ``~/.ssh/config`` work as they do with ``ssh``; what the cluster spec says wins;
* known_hosts (``~/.ssh/known_hosts`` and any ``UserKnownHostsFile``) is loaded for
  the host *and every jump host*; unknown keys are refused unless accepting new
  keys was asked for; changed keys are always refused (see ``hostkeys``);
* no agent forwarding, no environment on the command line (``Transport`` has no
  ``env`` argument; the host agent reads its environment from stdin);
* one SSH connection per host, opened on first use with ``connect_timeout``;
  ``run`` never raises: an unreachable host is exit code 255 with the reason.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import fabric
import paramiko

from dmlctl.text import host_port
from dmlctl.transport.agent_server import served
from dmlctl.transport.base import Command, Outcome, Transport, remote_command
from dmlctl.transport.hostkeys import (
    HostKeyPolicy,
    NewKeyCallback,
    UnknownHostKey,
    describe_bad_key,
    load_known_hosts,
)

UNREACHABLE = 255
TIMED_OUT = 124
NO_STATUS = -1  # paramiko's exit status of a session closed without one
STDERR_TAIL = 50


@dataclass(frozen=True)
class SshOptions:
    """How to connect: shared by every host of a cluster."""

    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    on_new_key: NewKeyCallback | None = None


class SshConnectError(Exception):
    """A connection could not be opened; ``str()`` is the one-line reason."""


_CAUSES = {
    errno.ECONNREFUSED: "refused (nothing listens there)",
    errno.EHOSTUNREACH: "failed: no route to host",
    errno.ENETUNREACH: "failed: network unreachable",
    errno.ETIMEDOUT: "timed out",
    errno.ECONNRESET: "reset by the host",
}
"""What a connection's socket error says, by errno, in words."""


def _describe(exc: BaseException, where: str, timeout: float, took: float | None = None) -> str:
    """Why the connection to ``where`` failed, by its real cause (no route, refused,
    timed out, closed, authentication, host key), with the seconds it took."""
    after = f" (after {took:.1f} s)" if took is not None else ""
    if isinstance(exc, paramiko.BadHostKeyException):
        return describe_bad_key(exc)
    if isinstance(exc, UnknownHostKey):
        return str(exc)
    if isinstance(exc, paramiko.SSHException) and "banner" in str(exc):
        if took is not None and took < 0.9 * timeout:  # closed, not silent
            return (
                f"connection to {where} closed before SSH's greeting{after}: not an SSH "
                "server there, or sshd dropped it (MaxStartups, a firewall, TCP wrappers)"
            )
        return f"no SSH answer from {where} within {timeout:g} s (is sshd listening there?)"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed at {where}{after}: {exc}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {where}: {exc.strerror}"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"connection to {where} timed out after {timeout:g} s"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        code = next(iter(codes)) if len(codes) == 1 else None
        return f"connection to {where} {_CAUSES.get(code or 0, 'failed: ' + str(exc))}{after}"
    if isinstance(exc, OSError) and exc.errno in _CAUSES:
        return f"connection to {where} {_CAUSES[exc.errno]}{after}"
    if isinstance(exc, EOFError):
        return f"connection to {where} closed by the host{after}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect to {where}: {exc.strerror}{after}"
    return f"cannot connect to {where}: {type(exc).__name__}: {exc}{after}"


class SSHTransport(Transport):
    """Runs commands on one remote host."""

    def __init__(
        self,
        host: str,
        address: str,
        *,
        port: int | None = None,
        user: str | None = None,
        identity_file: str | None = None,
        options: SshOptions = SshOptions(),
    ) -> None:
        self.host = host
        self.options = options
        key_files = [identity_file] if identity_file else None
        connect_kwargs: dict[str, Any] = {
            "timeout": options.connect_timeout,
            "banner_timeout": options.connect_timeout,
            "auth_timeout": options.connect_timeout,
        }
        if key_files:
            connect_kwargs["key_filename"] = key_files
        # Port 22 is the default: leave it to ~/.ssh/config (like `ssh host`).
        self._conn = fabric.Connection(
            address,
            user=user,
            port=port if port not in (None, 22) else None,
            connect_kwargs=connect_kwargs,
            forward_agent=False,
        )
        #: The host's network name (``HostName`` from ~/.ssh/config for an alias).
        self.hostname: str = self._conn.host
        self.where = f"{self._conn.user}@{host_port(self._conn.host, self._conn.port)}"
        jump = self._conn.ssh_config.get("proxyjump")
        #: How the connection goes, as ~/.ssh/config resolves it (no connection made):
        #: ``user@hostname:port``, and ``via JUMP`` with a ProxyJump.
        self.route = self.where + (f" via {jump}" if jump else "")
        self._lock = threading.Lock()
        self._secure(self._conn)

    def _secure(self, conn: fabric.Connection) -> None:
        """known_hosts + our policy on ``conn`` and every gateway (fabric auto-adds)."""
        files = [Path("~/.ssh/known_hosts").expanduser()]
        configured = conn.ssh_config.get("userknownhostsfile")
        if configured:
            files = [Path(os.path.expanduser(p)) for p in str(configured).split()] + files
        load_known_hosts(conn.client, files)
        conn.client.set_missing_host_key_policy(
            HostKeyPolicy(
                accept_new=self.options.accept_new_host_keys,
                save_to=files[0],
                on_new_key=self.options.on_new_key,
            )
        )
        if conn.connect_timeout is not None:
            conn.connect_kwargs.pop("timeout", None)
        gateway = conn.gateway
        if isinstance(gateway, fabric.Connection):
            gateway.connect_kwargs.setdefault("timeout", self.options.connect_timeout)
            gateway.forward_agent = False
            self._secure(gateway)

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            started = time.monotonic()
            try:
                self._conn.open()
            except Exception as e:
                self._conn.close()
                took = time.monotonic() - started
                raise SshConnectError(
                    _describe(e, self.where, self.options.connect_timeout, took)
                ) from e
            transport = self._conn.client.get_transport()
            if transport is None or not transport.is_active():
                raise SshConnectError(f"connection to {self.where} is closed")
            return transport

    def _channel(self, argv: Sequence[str], cwd: str | None) -> paramiko.Channel:
        chan = self._transport().open_session(timeout=self.options.connect_timeout)
        chan.exec_command(remote_command(argv, cwd))
        return chan

    def execute(self, command: Command) -> Outcome:
        """``command`` run to its end over this host's connection (255 and the reason
        when the host cannot be reached, 124 after ``command.timeout``)."""
        try:
            chan = self._channel(command.argv, command.cwd)
        except SshConnectError as e:
            return UNREACHABLE, "", str(e)
        except (paramiko.SSHException, OSError, EOFError) as e:
            return UNREACHABLE, "", _describe(e, self.where, self.options.connect_timeout)
        out: list[bytes] = []
        err: list[bytes] = []
        readers = [
            threading.Thread(target=_drain, args=(chan.makefile("rb"), out), daemon=True),
            threading.Thread(target=_drain, args=(chan.makefile_stderr("rb"), err), daemon=True),
        ]
        for r in readers:
            r.start()
        try:
            if command.input:
                chan.sendall(command.input)
            chan.shutdown_write()
        except (OSError, paramiko.SSHException):
            pass
        if chan.status_event.wait(command.timeout):
            code = chan.recv_exit_status()
            if code == NO_STATUS:
                err.append(b"\nthe host closed the session without an exit status")
        else:
            code = TIMED_OUT
            err.append(f"\ntimed out after {command.timeout:g} s".encode())
        chan.close()
        for r in readers:
            r.join(2.0)
        return (
            code,
            b"".join(out).decode("utf-8", "replace"),
            b"".join(err).decode("utf-8", "replace"),
        )

    def start(self, argv: Sequence[str], *, cwd: str | None = None) -> SSHProcess:
        """Start ``argv`` (a host agent from the host's agent server where one matches:
        :func:`~dmlctl.transport.agent_server.served`); raises :class:`SshConnectError`
        if the host is unreachable."""
        return SSHProcess(self.host, self._channel(served(argv), cwd))

    def close(self) -> None:
        self._conn.close()


def _drain(stream: BinaryIO, into: list[bytes]) -> None:
    while chunk := stream.read(65536):
        into.append(chunk)


class SSHProcess:
    """A command running on a remote host, over one SSH channel."""

    def __init__(self, host: str, chan: paramiko.Channel) -> None:
        self.host = host
        self._chan = chan
        self._stdin = chan.makefile_stdin("wb")
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()

    def _drain_stderr(self) -> None:
        for raw in self._chan.makefile_stderr("rb"):
            self._stderr.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def lines(self) -> Iterator[str]:
        for raw in self._chan.makefile("rb"):
            yield raw.decode("utf-8", "replace").rstrip("\n")

    def send(self, line: str) -> bool:
        try:
            self._stdin.write((line + "\n").encode())
            self._stdin.flush()
            return True
        except (OSError, paramiko.SSHException, EOFError):
            return False

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
            self._chan.shutdown_write()

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._chan.status_event.wait(timeout):
            return None
        self._err_thread.join(1.0)
        return int(self._chan.recv_exit_status())

    def alive_here(self) -> bool:
        """Never: the command runs on another host, whose silence may mean it is lost."""
        return False

    def kill(self) -> None:
        """Close the channel: the remote agent sees its stdin close and stops its tree."""
        self._chan.close()

    def stderr_tail(self) -> list[str]:
        return list(self._stderr)
