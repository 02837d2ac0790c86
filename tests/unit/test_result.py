"""A command's :class:`~dmlctl.transport.base.Result` says why it failed, never with an
empty reason."""

from __future__ import annotations

import sys

from dmlctl.transport.base import Result
from dmlctl.transport.local import LocalTransport


def _result(code: int, out: str, err: str) -> Result:
    return Result("h", ("cmd",), code, out, err, 0.0)


def test_why_is_the_end_of_stderr_else_the_exit_code_and_what_was_printed() -> None:
    assert _result(1, "out", "  first\nlast line  \n").why() == "first\nlast line"
    assert _result(2, "", "x" * 500).why(10) == "x" * 10
    assert _result(-1, "", "").why() == "exit code -1"
    assert _result(3, "no digits here\n", "").why() == "exit code 3, printed 'no digits here'"


def test_a_local_command_that_prints_only_to_stdout_and_fails_says_both() -> None:
    argv = [sys.executable, "-c", "print('half a port'); raise SystemExit(4)"]
    res = LocalTransport("here").run(argv, timeout=30)
    assert (res.host, res.argv, res.ok) == ("here", tuple(argv), False)
    assert res.why() == "exit code 4, printed 'half a port'"
