"""Small helpers shared by the CLI commands (consoles, the run store)."""

from __future__ import annotations

import sys

from rich.console import Console


def stdout_console() -> Console:
    return Console(file=sys.stdout, highlight=False)


def stderr_console() -> Console:
    return Console(file=sys.stderr, highlight=False)
