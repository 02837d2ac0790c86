"""An allocation asked for with ``salloc`` (``slurm.salloc``: an interactive
allocation, for partitions or QOS that take only those): ``salloc`` runs the holding
script on this machine, in a session of its own, and relinquishes the allocation when
the script ends; it outlives the launch that started it (a detached run's controller
goes on without it). Its words go to a file, never a pipe: a pipe whose reader is
gone would kill it with SIGPIPE and end the allocation under the run."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence

from dmlctl.slurm.commands import TIMEOUT_S, failure, require, slurm_env

_HELD: list[subprocess.Popen[bytes]] = []
"""The salloc processes started here: kept, not reaped (each outlives its call)."""

GIVEN = re.compile(r"job allocation (\d+)")
"""salloc's line naming the job: ``Pending job allocation 7`` or ``Granted job
allocation 7``."""


def argv_of(request: Sequence[str], script: str) -> list[str]:
    """The ``salloc`` command (``request``: its options) that holds the allocation
    with ``script``."""
    return [*request, "sh", "-c", script]


def submit(request: Sequence[str], script: str, conf: str | None) -> str:
    """Start ``salloc`` (see the module docstring) and return the job id as soon as it
    names one; SlurmError (SlurmRefused for a request Slurm calls invalid) when it
    ends first, or names none within the timeout of a Slurm command."""
    argv = [require("salloc"), *argv_of(request, script)[1:]]
    with tempfile.TemporaryFile(mode="w+", prefix="dmlctl-salloc-") as words:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=words,
            env=slurm_env(conf),
            start_new_session=True,
        )
        _HELD.append(proc)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            ended = proc.poll()
            words.seek(0)
            said = words.read()
            if found := GIVEN.search(said):
                return found[1]
            if ended is not None or time.monotonic() > deadline:
                if ended is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, 15)
                raise failure(list(request), said, ended if ended is not None else 124)
            time.sleep(0.05)
