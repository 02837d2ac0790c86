"""Typed errors and exit codes shared by the whole control plane.

The CLI has exactly one error boundary (``dmlctl.cli.app``): it catches
:class:`DmlctlError`, prints ``str(error)`` on one line per problem and exits with
``error.exit_code``. Anything else is an internal error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from dmlctl.text import plural


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


MAX_MESSAGE = 200
"""Longest message of one spec issue (values in it are quoted shortened already)."""

MAX_SHOWN_ISSUES = 20
"""Most issues a :class:`SpecError` prints; the rest are counted."""

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str, limit: int) -> str:
    """``text`` on one line: control characters and lone surrogates escaped
    (``\\n``, ``\\x1b``), cut to ``limit`` characters with ``...``."""
    text = _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec file: where it is and what is wrong.

    ``str()`` is one line, ``file:line key: message``, whatever the parts hold."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        file = printable(self.file, 120)
        where = f"{file}:{self.line}" if self.line is not None else file
        message = printable(self.message, MAX_MESSAGE)
        if self.path:
            return f"{where} {printable(self.path, 80)}: {message}"
        return f"{where}: {message}"


class SpecError(DmlctlError):
    """A spec file (cluster, job, hostfile) is invalid; carries every issue found
    (``str()`` shows the first :data:`MAX_SHOWN_ISSUES`, then how many more)."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, issues: Sequence[SpecIssue]) -> None:
        self.issues = tuple(issues)
        lines = [str(i) for i in self.issues[:MAX_SHOWN_ISSUES]]
        if len(self.issues) > MAX_SHOWN_ISSUES:
            more = len(self.issues) - MAX_SHOWN_ISSUES
            lines.append(
                f"{printable(self.issues[0].file, 120)}: ... and {plural(more, 'more issue')}"
            )
        super().__init__("\n".join(lines))


class PlanError(UsageError):
    """A job cannot be planned on a cluster (more workers than slots, a strategy's own
    limits …): raised by the pure planner with the spec key at fault, so that the
    launcher can name the file and line (``spec`` is ``"job"`` or ``"cluster"``;
    ``path`` a key path such as ``("strategy", "params")``; ``involves``: other
    top-level job keys the conflict is with, such as ``workers``, so that a value
    given by a flag is named as the flag)."""

    def __init__(
        self,
        spec: str,
        path: tuple[str | int, ...],
        message: str,
        involves: tuple[str, ...] = (),
    ) -> None:
        self.spec = spec
        self.path = path
        self.message = message
        self.involves = involves
        super().__init__(message)


class RunNotFound(UsageError):
    """No run directory matches the id the user gave."""


class TransportError(DmlctlError):
    """A command could not be delivered to a host (not: the command failed)."""


class ProvisionError(DmlctlError):
    """A host could not be made ready (preflight, port choice, sync or setup failed);
    names every host at fault."""
