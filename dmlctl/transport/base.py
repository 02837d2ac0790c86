"""How commands reach a host: one narrow, typed interface.

``run`` executes a command to completion and always returns a :class:`Result`;
``start`` starts a long-lived command (the host agent) and returns a
:class:`Process` whose stdout is read line by line. Implementations:
:class:`dmlctl.transport.local.LocalTransport` (subprocess) and, for remote
hosts, an SSH transport; tests use scripted fakes through the same interface.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Result:
    """The outcome of one finished command (whatever the options, always this type)."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def why(self, most: int = 300) -> str:
        """Why the command failed, never empty: the last ``most`` characters of its
        stderr, else its exit code with the end of what it printed, if anything."""
        err, out = self.stderr.strip(), self.stdout.strip()
        if err:
            return err[-most:]
        return f"exit code {self.exit_code}" + (f", printed {out[-most:]!r}" if out else "")


class Process(Protocol):
    """A running command on a host."""

    host: str

    def lines(self) -> Iterator[str]:
        """Lines of the command's stdout (without newline) until it closes."""
        ...

    def send(self, line: str) -> bool:
        """Write one line to the command's stdin; False if stdin is closed."""
        ...

    def close_stdin(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None if still running after ``timeout`` seconds."""
        ...

    def kill(self) -> None:
        """Stop the command (and, where the transport can, everything it started)."""
        ...

    def stderr_tail(self) -> list[str]:
        """The last lines the command wrote to stderr."""
        ...

    def alive_here(self) -> bool:
        """True when the command runs on this machine and has not ended: then its
        silence means a loaded machine, never a lost host."""
        ...


@dataclass(frozen=True)
class Command:
    """One command to run to its end on a host: what :meth:`Transport.run` was asked."""

    argv: tuple[str, ...]
    timeout: float
    cwd: str | None = None
    input: bytes | None = None


#: What a command came to: exit code, stdout, stderr.
Outcome = tuple[int, str, str]


class Transport(Protocol):
    """One host's way to run commands.

    ``run`` never raises for a command that ran and failed, nor for a host that
    cannot be reached: both come back as a :class:`Result` (exit code 255 and the
    reason in ``stderr`` for a connection failure, 124 for a timeout). There is no
    ``env`` argument on purpose: on a remote host it would end up on the command
    line; environment travels on stdin (see the host agent).

    A transport that subclasses this one writes only :meth:`execute` and
    :meth:`start`: :meth:`run` is shared (it times the command and names the host
    and what was asked in the :class:`Result`).
    """

    host: str

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        cwd: str | None = None,
        input: bytes | None = None,
    ) -> Result:
        """``argv`` run to its end on this host (see the class docstring)."""
        command = Command(tuple(argv), timeout, cwd, input)
        start = time.monotonic()
        code, out, err = self.execute(command)
        return Result(self.host, command.argv, code, out, err, time.monotonic() - start)

    def execute(self, command: Command) -> Outcome:
        """What ``command`` came to on this host; never raises (see :meth:`run`)."""
        ...

    def start(self, argv: Sequence[str], *, cwd: str | None = None) -> Process: ...


def remote_command(argv: Sequence[str], cwd: str | None) -> str:
    """The shell command line for ``argv`` run in ``cwd`` (``~/`` means the home dir)."""
    cmd = shlex.join(argv)
    if cwd is None:
        return cmd
    if cwd == "~" or cwd.startswith("~/"):
        where = '"$HOME"' + (shlex.quote(cwd[1:]) if len(cwd) > 1 else "")
    else:
        where = shlex.quote(cwd)
    return f"cd {where} && exec {cmd}"
