"""Typed errors and exit codes shared by the whole control plane.

The CLI has exactly one error boundary (``dmlctl.cli.app``): it catches
:class:`DmlctlError`, prints ``str(error)`` on one line per problem and exits with
``error.exit_code``. Anything else is an internal error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes of every ``dmlctl`` command."""

    OK = 0
    RUN_FAILED = 1
    BAD_INPUT = 2
    INTERNAL = 3
    INTERRUPTED = 130


class DmlctlError(Exception):
    """Base class of every error dmlctl reports to a user without a traceback."""

    exit_code: ExitCode = ExitCode.RUN_FAILED


class UsageError(DmlctlError):
    """Bad input that is not a spec file: a flag value, a missing run id, …"""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec file: where it is and what is wrong."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where} {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class SpecError(DmlctlError):
    """A spec file (cluster, job, hostfile) is invalid; carries every issue found."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, issues: Sequence[SpecIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class RunNotFound(UsageError):
    """No run directory matches the id the user gave."""


class TransportError(DmlctlError):
    """A command could not be delivered to a host (not: the command failed)."""
