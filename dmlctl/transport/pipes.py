"""The stdin, stdout and stderr of a command on this machine, as a
:class:`~dmlctl.transport.base.Process` uses them: lines out, lines in, and the last
lines of stderr, drained in a thread so that the command never blocks on a full pipe."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import IO

STDERR_TAIL = 50


def text_end(fd: int, mode: str) -> IO[str]:
    """Descriptor ``fd`` as text, UTF-8 with bad bytes replaced (line-buffered when
    written), as ``subprocess.Popen(text=True, bufsize=1)`` makes its pipes."""
    return open(fd, mode, buffering=1 if mode == "w" else -1, encoding="utf-8", errors="replace")


class Pipes:
    """A command's three pipes (the other ends are the command's)."""

    def __init__(self, host: str, stdin: IO[str], stdout: IO[str], stderr: IO[str]) -> None:
        self.host = host
        self._stdin, self._stdout, self._stderr_pipe = stdin, stdout, stderr
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        for line in self._stderr_pipe:
            self._stderr.append(line.rstrip("\n"))

    def lines(self) -> Iterator[str]:
        for line in self._stdout:
            yield line.rstrip("\n")

    def send(self, line: str) -> bool:
        stdin = self._stdin
        if stdin.closed:
            return False
        try:
            stdin.write(line + "\n")
            stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def close_stdin(self) -> None:
        if not self._stdin.closed:
            with contextlib.suppress(OSError):
                self._stdin.close()

    def join_stderr(self, timeout: float) -> None:
        """Give the stderr reader ``timeout`` seconds to reach the end (after an exit)."""
        self._stderr_thread.join(timeout)

    def stderr_tail(self) -> list[str]:
        return list(self._stderr)
