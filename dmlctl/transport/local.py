"""LocalTransport: commands on this machine through ``subprocess``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from dmlctl.agent.procs import descendants, signal_all
from dmlctl.transport.agent_server import WarmProcess, start_agent
from dmlctl.transport.base import Command, Outcome, Transport
from dmlctl.transport.pipes import Pipes


class LocalProcess(Pipes):
    """A command started in its own session (so a terminal's Ctrl-C reaches only the
    controller, which then stops the run in order)."""

    def __init__(
        self,
        host: str,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        self.pid = self._proc.pid
        assert self._proc.stdin and self._proc.stdout and self._proc.stderr
        super().__init__(host, self._proc.stdin, self._proc.stdout, self._proc.stderr)

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.join_stderr(1.0)
        return code

    def alive_here(self) -> bool:
        """Whether the command is still running (it runs on this machine)."""
        return self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the command and every process it started, wherever they run: its
        descendants first (a host agent's ranks run in sessions of their own, and
        would be left to init once the agent is gone), then its process group."""
        signal_all(descendants(self._proc.pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)


class LocalTransport(Transport):
    """Runs commands on this machine (``env``: their whole environment; default this
    process's)."""

    def __init__(self, host: str = "local", env: Mapping[str, str] | None = None) -> None:
        self.host = host
        self.env = env

    def execute(self, command: Command) -> Outcome:
        """``command`` run to its end here, as a subprocess."""
        try:
            proc = subprocess.run(
                list(command.argv),
                cwd=command.cwd,
                env=self.env,
                input=command.input,
                capture_output=True,
                timeout=command.timeout,
            )
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode("utf-8", "replace") if isinstance(e.stdout, bytes) else ""
            return 124, out, f"timed out after {command.timeout:g} s"
        except OSError as e:
            return 127, "", str(e)
        return proc.returncode, _text(proc.stdout), _text(proc.stderr)

    def start(self, argv: Sequence[str], *, cwd: str | None = None) -> LocalProcess | WarmProcess:
        """``argv`` started here; a host agent forked by the agent server when there is
        one (:mod:`dmlctl.transport.agent_server`)."""
        return start_agent(self.host, argv, cwd) or LocalProcess(self.host, argv, cwd)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")
