"""A command whose reader goes away (``dmlctl launch job.yaml | head -3``) goes on:
what it would print is dropped, never raised. The run a launch watches therefore ends
as it would have, and the command's exit code is still the run's."""

from __future__ import annotations

import io
import os
from typing import BinaryIO, TextIO


class ForgivingStream(io.TextIOBase):
    """A text stream over ``inner`` that, once its reader has gone (EPIPE), drops
    everything written to it and points its file descriptor at ``/dev/null`` (so the
    interpreter's own last flush finds nothing to complain about)."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self._inner = inner
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._inner.write(text)
            except BrokenPipeError:
                self.lose_reader()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._inner.flush()
            except BrokenPipeError:
                self.lose_reader()

    def lose_reader(self) -> None:
        """From now on drop what is written (the reader has gone)."""
        self.gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._inner.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass

    @property
    def buffer(self) -> BinaryIO:
        """The binary layer (``dmlctl logs`` writes bytes): the stream's own."""
        return self._inner.buffer

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._inner.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self._inner.errors
