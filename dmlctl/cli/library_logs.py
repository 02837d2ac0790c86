"""Where the SSH library's own logging goes: ``$DMLCTL_HOME/ssh.log``, never the
terminal. paramiko logs every failed connection with its traceback, line by line (a
host that does not answer, retried, filled a screen with hundreds of lines); dmlctl
says what went wrong in one line per host itself. ``--debug`` shows them on stderr too.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from collections.abc import Callable
from pathlib import Path

LIBRARIES = ("paramiko", "invoke", "fabric")
MAX_BYTES = 1 << 20  # then one older file, <name>.1


class _LazyFile(logging.Handler):
    """A rotating log file (0600), found and opened when the first record comes (most
    commands log nothing); a record it cannot write is dropped without a word."""

    def __init__(self, where: Callable[[], Path]) -> None:
        super().__init__(logging.WARNING)
        self._where = where
        self._file: logging.handlers.RotatingFileHandler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._file is None:
                path = self._where()
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
                self._file = logging.handlers.RotatingFileHandler(
                    path, maxBytes=MAX_BYTES, backupCount=1, encoding="utf-8"
                )
                self._file.setFormatter(
                    logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
                )
            self._file.emit(record)
        except Exception:  # a log that cannot be written must not disturb the command
            pass


def route_library_logs(where: Callable[[], Path], *, debug: bool = False) -> None:
    """Send the warnings and errors of :data:`LIBRARIES` to the file ``where()`` (and,
    with ``debug``, to stderr as before) instead of the terminal."""
    handler = _LazyFile(where)
    for name in LIBRARIES:
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        logger.addHandler(handler)
        logger.propagate = debug
