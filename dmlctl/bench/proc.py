"""Running the commands a benchmark compares, the same way for every benchmark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from dmlctl.bench.runs import BenchInterrupted
from dmlctl.errors import DmlctlError

_TAIL = 1500  # characters of output shown when a command fails
STOP_GRACE_S = 30.0
"""Seconds a command stopped by Ctrl-C gets to stop its ranks before it is killed."""


def bench_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``DMLCTL_HOME=home``, ``extra``, and this
    dmlctl's source tree first on ``PYTHONPATH``, so every side imports the same
    tree, installed or not."""
    env = {**os.environ, "DMLCTL_HOME": str(home), **extra}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def torchrun_argv(
    workers: int, script: Path | str, args: Sequence[str] = (), *, max_restarts: int = 0
) -> list[str]:
    """argv of bare torchrun (``python -m torch.distributed.run --standalone``) running
    ``script`` with ``args`` on ``workers`` local ranks, restarting them up to
    ``max_restarts`` times (0: ``--max-restarts`` left out)."""
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(workers), *restarts, str(script), *args),
    ]


def run_checked(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    *,
    timeout: float,
    error: type[DmlctlError],
) -> str:
    """Run ``argv`` to its end (stdin closed, output captured) and return its stdout;
    raise ``error`` naming the command, with the tail of its output, when it exits
    non-zero or runs longer than ``timeout`` seconds. A Ctrl-C (or a SIGTERM, which
    ``dmlctl bench`` turns into one) stops the command as Ctrl-C would and raises
    :class:`~dmlctl.bench.runs.BenchInterrupted`: the bench ends there."""
    proc = subprocess.Popen(
        argv,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise error(f"`{' '.join(argv)}` ran longer than {timeout:.0f}s") from None
    except KeyboardInterrupt:
        _stop(proc)
        raise BenchInterrupted(f"benchmark interrupted: `{argv_name(argv)}` was stopped") from None
    if proc.returncode != 0:
        tail = (out + err)[-_TAIL:].strip()
        raise error(f"`{' '.join(argv)}` exited with {proc.returncode}:\n{tail}")
    return out


def argv_name(argv: Sequence[str]) -> str:
    """The command ``argv`` runs, short: ``dmlctl launch``, ``torch.distributed.run``."""
    if len(argv) > 2 and argv[1] == "-m":
        return " ".join(w for w in argv[2:4] if not w.startswith("-") and "/" not in w)
    return Path(argv[0]).name if argv else ""


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop ``proc`` as Ctrl-C would (SIGINT: dmlctl and torchrun stop their ranks),
    then, after :data:`STOP_GRACE_S`, for good; its output is dropped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
