"""The rank entry point torchrun runs: ``python -m dmlctl.runtime.entry SCRIPT ARGS…``.

Promises, for every rank process:

* file descriptors 1 and 2 point at ``rank-<R>.stdout`` / ``rank-<R>.stderr`` in
  ``$DMLCTL_RANK_DIR`` (append mode), so a rank never blocks on a pipe and nothing
  it — or any child it starts — prints is lost;
* a ``start`` record is written before the script runs, an ``exit`` record after it
  ends (code 0, or 1 with the exception type, message and traceback);
* the script runs unchanged, as ``__main__``, with ``sys.argv`` = [SCRIPT, ARGS…]
  and its directory first on ``sys.path`` — exactly as torchrun would run it;
* the process ends through :func:`finish` (atexit handlers run, output flushed);
* on failure, torchelastic's error file (``$TORCHELASTIC_ERROR_FILE``) is written
  too, so torchrun's own summary names the exception.

Without ``$DMLCTL_RANK_DIR`` it only runs the script.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import time
import traceback
from typing import Any

from dmlctl import protocol

TRACEBACK_LINES = 40


def _redirect(rank_dir: str, rank: int) -> None:
    os.makedirs(rank_dir, exist_ok=True)
    for fd, path in (
        (1, protocol.rank_stdout(rank_dir, rank)),
        (2, protocol.rank_stderr(rank_dir, rank)),
    ):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)


def _user_frames(exc: BaseException, script: str) -> BaseException:
    """``exc`` with the traceback frames of this wrapper and runpy cut off, so the
    traceback starts in the user's script (unchanged if the script is not in it)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return exc.with_traceback(tb) if tb is not None else exc


def _error_record(exc: BaseException) -> dict[str, Any]:
    lines = "".join(traceback.format_exception(exc)).rstrip("\n").split("\n")
    return {
        "type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": lines[-TRACEBACK_LINES:],
    }


def _write_torchelastic_error(error: dict[str, Any]) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    message = {
        "message": f"{error['type']}: {error['message']}",
        "extraInfo": {
            "py_callstack": "\n".join(error["traceback"]),
            "timestamp": str(int(time.time())),
        },
    }
    try:  # whole or absent: torchrun may read it the moment this rank exits
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"message": message}, f)
        os.replace(tmp, path)
    except OSError:
        pass


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def main(argv: list[str]) -> int:
    """Run ``argv[0]`` as a script with ``argv[1:]`` as its arguments."""
    if not argv:
        print("usage: python -m dmlctl.runtime.entry SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    rank_dir = os.environ.get(protocol.ENV_RANK_DIR)
    writer = None
    if rank_dir:
        _redirect(rank_dir, rank)
        writer = protocol.RankEventWriter(rank_dir, rank)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        try:
            role = protocol.local_role(os.environ, local_rank)
        except ValueError:
            role = protocol.ROLE_WORKER  # dmlctl.init() reports the bad variable
        writer.start(local_rank, role, os.environ.get(protocol.ENV_HOST, ""))
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
        if code != 0 and isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        if writer is not None:
            error: dict[str, Any] | None = None if code == 0 else {
                "type": "SystemExit", "message": f"exit code {code}", "traceback": [],
            }
            writer.exit(code, error)
        return code
    except BaseException as e:
        e = _user_frames(e, os.path.abspath(script))
        error = _error_record(e)
        traceback.print_exception(e)
        sys.stderr.flush()
        _write_torchelastic_error(error)
        if writer is not None:
            writer.exit(1, error)
        return 1
    if writer is not None:
        writer.exit(0, None)
    return 0


def finish(code: int) -> None:
    """Exit with ``code`` after the script's atexit handlers ran and output is flushed,
    skipping the interpreter's own teardown: on gloo, a communication thread freed
    during that teardown can abort a rank that has already finished its work
    (pytorch/pytorch#190489), which would turn a successful run into a failed one."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    finish(main(sys.argv[1:]))
