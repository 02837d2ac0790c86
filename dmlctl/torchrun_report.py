"""torchrun's printed output as dmlctl reads it (torch-free): the lines of its failure
summary, which the host agent keeps for its exit message, and the line that says its
rendezvous store could not listen on the planned port."""

from __future__ import annotations

import re

_SUMMARY_LINE = re.compile(r"^\s*(rank|exitcode)\s*:|^Root Cause")
_PORT_TAKEN = re.compile(
    r"failed to (?:listen on any local network address\. port: (\d+).*EADDRINUSE"
    r"|bind to \S*?:(\d+) \(errno: 98 - Address already in use)"
)


def is_failure_summary_line(line: str) -> bool:
    """Whether ``line`` of torchrun's output belongs to its failure summary: a
    ``rank : N`` or ``exitcode : X`` entry, the "Root Cause" heading, or the line that
    says its rendezvous store could not listen on its port (:func:`port_taken`)."""
    return _SUMMARY_LINE.match(line) is not None or port_taken(line) is not None


def port_taken(line: str) -> int | None:
    """The port of torchrun's line saying that its rendezvous store could not listen
    on it because another process had taken it (``EADDRINUSE``), else None."""
    m = _PORT_TAKEN.search(line)
    return int(m.group(1) or m.group(2)) if m else None
