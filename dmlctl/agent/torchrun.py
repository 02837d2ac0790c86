"""``python -m dmlctl.agent.torchrun ARGS``: torchrun (``python -m
torch.distributed.run ARGS``) that writes down the ranks that failed, typed.

When ranks fail, torchrun raises its ``ChildFailedError`` holding its own record of
each one: global rank, exit code (negative: the signal that killed it), pid, and when
(read from the rank's error file, ``TORCHELASTIC_ERROR_FILE``, when the rank wrote
one). Before torchrun prints its report and exits as it always does, :func:`run`
writes that record to ``torchrun-failures-<attempt>.json`` in the host's rank
directory (:func:`dmlctl.protocol.torchrun_failures`); the host agent sends it with
its exit message (:func:`read_failures`), and the controller judges the failed rank
from it instead of from torchrun's printed report. A warm agent's forked torchrun
runs the same :func:`run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dmlctl import protocol, wire


def run(argv: Sequence[str]) -> None:
    """torchrun's ``main(argv)``; its failed ranks written down first when they fail
    (its ``ChildFailedError`` then goes on as it would)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(list(argv))
    except ChildFailedError as e:
        write_failures(e.failures)
        raise


def write_failures(failures: Mapping[int, Any], environ: Mapping[str, str] = os.environ) -> None:
    """Write torchrun's ``failures`` (global rank → ``ProcessFailure``) where the agent
    of this attempt reads them; nothing without a rank directory (a plain torchrun)
    or when it cannot be written (the agent then reads torchrun's report)."""
    rank_dir = environ.get(protocol.ENV_RANK_DIR)
    if not rank_dir:
        return
    records = [
        wire.RankFailure(int(rank), int(f.exitcode), int(f.pid), float(f.timestamp))
        for rank, f in sorted(failures.items())
    ]
    path = protocol.torchrun_failures(rank_dir, environ.get(protocol.ENV_ATTEMPT, "1"))
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            out.write(wire.encode_failures(records))
        os.replace(path + ".tmp", path)
    except OSError:  # a full disk: no half-written file left behind
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")


def read_failures(rank_dir: str, attempt: str) -> tuple[wire.RankFailure, ...]:
    """The failed ranks torchrun wrote down in ``attempt`` (empty when it wrote none,
    or what it wrote cannot be read)."""
    try:
        with open(protocol.torchrun_failures(rank_dir, attempt), encoding="utf-8") as f:
            return wire.decode_failures(json.load(f))
    except (OSError, ValueError):
        return ()


if __name__ == "__main__":
    run(sys.argv[1:])
