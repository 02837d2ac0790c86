"""Small helpers shared by the CLI commands (consoles, the run store)."""

from __future__ import annotations

import sys

from rich.console import Console

# Pipes and files get wide, untruncated lines (run ids, log lines); a terminal its width.
PIPE_WIDTH = 200


def stdout_console() -> Console:
    return Console(
        file=sys.stdout, highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH
    )


def stderr_console() -> Console:
    return Console(file=sys.stderr, highlight=False)
