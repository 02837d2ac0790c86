"""Running the commands a benchmark compares, the same way for every benchmark."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from dmlctl.errors import DmlctlError

_TAIL = 1500  # characters of output shown when a command fails


def bench_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``DMLCTL_HOME=home``, ``extra``, and this
    dmlctl's source tree first on ``PYTHONPATH``, so every side imports the same
    tree, installed or not."""
    env = {**os.environ, "DMLCTL_HOME": str(home), **extra}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


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
    non-zero or runs longer than ``timeout`` seconds."""
    try:
        proc = subprocess.run(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise error(f"`{' '.join(argv)}` ran longer than {timeout:.0f}s") from None
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-_TAIL:].strip()
        raise error(f"`{' '.join(argv)}` exited with {proc.returncode}:\n{tail}")
    return proc.stdout
