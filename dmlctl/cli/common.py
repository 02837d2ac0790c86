"""Small helpers shared by the CLI commands (consoles, the run store, ``--cluster``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from dmlctl.errors import UsageError

if TYPE_CHECKING:
    from dmlctl.spec.models import ClusterSpec

CLUSTER_OPTION = typer.Option(
    None, "--cluster", "-c", help="Cluster spec; default: this machine, one worker per core."
)
"""``--cluster FILE`` of the commands that run on a cluster file or else on this machine
(``launch``, ``bench comm``, ``bench advise``)."""

PIPE_WIDTH = 80
"""The width of tables written to a pipe or a file when ``COLUMNS`` does not say one."""


def output_width(environ: Mapping[str, str] = os.environ) -> int | None:
    """The width of what goes to stdout: the terminal's (None: rich asks it), else
    ``COLUMNS`` when it is a number, else :data:`PIPE_WIDTH`."""
    if sys.stdout.isatty():
        return None
    columns = environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) >= 20 else PIPE_WIDTH


def stdout_console() -> Console:
    return Console(file=sys.stdout, highlight=False, width=output_width())


def stderr_console() -> Console:
    return Console(file=sys.stderr, highlight=False)


MAX_CONNECT_TIMEOUT = 3600.0
"""The longest ``--connect-timeout`` taken (an hour: a connection takes seconds)."""


def check_connect_timeout(value: float) -> float:
    """``value`` when it is a finite number of seconds in (0, :data:`MAX_CONNECT_TIMEOUT`];
    else :class:`~dmlctl.errors.UsageError` (exit 2) saying so."""
    if not (0 < value <= MAX_CONNECT_TIMEOUT):  # also false for nan
        raise UsageError(
            f"--connect-timeout: must be a number of seconds above 0 and at most "
            f"{MAX_CONNECT_TIMEOUT:g}, got {value:g}"
        )
    return value


def no_slurm(cluster: ClusterSpec, command: str, path: object) -> ClusterSpec:
    """``cluster``, unless it is a Slurm cluster, which ``command`` does not run on yet:
    then a one-line UsageError (exit 2) naming the file."""
    if cluster.scheduler == "slurm":
        raise UsageError(
            f"{path}: {command} does not run on a Slurm cluster yet (scheduler: slurm); "
            "`dmlctl launch JOB --cluster` does"
        )
    return cluster
