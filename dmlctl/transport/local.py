"""LocalTransport: commands on this machine through ``subprocess``."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from dmlctl.agent.procs import descendants, signal_all
from dmlctl.transport.base import Result

STDERR_TAIL = 50


class LocalProcess:
    """A command started in its own session (so a terminal's Ctrl-C reaches only the
    controller, which then stops the run in order)."""

    def __init__(
        self,
        host: str,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
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
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line.rstrip("\n"))

    def lines(self) -> Iterator[str]:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            yield line.rstrip("\n")

    def send(self, line: str) -> bool:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return False
        try:
            stdin.write(line + "\n")
            stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def close_stdin(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._stderr_thread.join(1.0)
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

    def stderr_tail(self) -> list[str]:
        return list(self._stderr)


class LocalTransport:
    """Runs commands on this machine."""

    def __init__(self, host: str = "local") -> None:
        self.host = host

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        cwd: str | None = None,
        input: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        """``argv`` to its end (``env``: the whole environment; default this one's)."""
        start = time.monotonic()
        try:
            proc = subprocess.run(
                list(argv),
                cwd=cwd,
                env=env,
                input=input,
                capture_output=True,
                timeout=timeout,
            )
            code = proc.returncode
            out = proc.stdout.decode("utf-8", "replace")
            err = proc.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            code = 124
            out = e.stdout.decode("utf-8", "replace") if isinstance(e.stdout, bytes) else ""
            err = f"timed out after {timeout:g} s"
        except OSError as e:
            code, out, err = 127, "", str(e)
        return Result(self.host, tuple(argv), code, out, err, time.monotonic() - start)

    def start(self, argv: Sequence[str], *, cwd: str | None = None) -> LocalProcess:
        return LocalProcess(self.host, argv, cwd)
