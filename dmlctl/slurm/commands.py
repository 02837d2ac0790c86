"""Slurm's own commands (``sbatch``, ``squeue``, ``scontrol``, ``scancel``, ``srun``)
as dmlctl runs them: with the cluster's ``SLURM_CONF`` when it names one, and without
the ``SLURM_*`` variables of an allocation dmlctl itself may be running in (they
would pin every command to that allocation instead of the run's own).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from dmlctl.errors import DmlctlError, ExitCode

TIMEOUT_S = 60.0
"""Longest wait for one Slurm query or request (slurmctld answers in well under it)."""

INHERITED_PREFIXES = ("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")
KEPT = ("SLURM_CONF",)


REFUSALS = (
    "node configuration is not available",
    "more processors requested than permitted",
    "requested time limit is invalid",
    "job violates accounting/qos policy",
    "invalid account",
)
"""sbatch's words (lower case) for a request that can never be met as written."""


class SlurmError(DmlctlError):
    """A Slurm command failed or is missing; the message names the command and why."""


class SlurmRefused(SlurmError):
    """Slurm refused what the cluster file asks for (a partition, account or option it
    does not know): the user's input, exit 2."""

    exit_code = ExitCode.BAD_INPUT


def slurm_env(conf: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without an enclosing
    allocation's ``SLURM_*``/``SRUN_*``/``SALLOC_*``/``SBATCH_*`` variables, with
    ``SLURM_CONF`` set to ``conf`` where given."""
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if k in KEPT or not k.startswith(INHERITED_PREFIXES)
    }
    if conf is not None:
        env["SLURM_CONF"] = conf
    return env


def require(tool: str) -> str:
    """The path of Slurm's ``tool``; SlurmError when it is not installed here."""
    path = shutil.which(tool)
    if path is None:
        raise SlurmError(
            f"{tool} not found: a Slurm cluster is used from a machine with Slurm's client "
            "commands (Debian/Ubuntu: apt-get install slurm-client)"
        )
    return path


def run(
    argv: Sequence[str],
    conf: str | None,
    *,
    timeout: float = TIMEOUT_S,
    check: bool = True,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command to its end (``input`` on its stdin); with ``check``,
    SlurmError naming the command and its last line of stderr when it fails
    (SlurmRefused when Slurm calls the request invalid)."""
    full = [require(argv[0]), *argv[1:]]
    try:
        proc = subprocess.run(
            full,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=slurm_env(conf),
        )
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"`{' '.join(argv)}` gave no answer in {timeout:g} s") from e
    if check and proc.returncode != 0:
        raise failure(argv, proc.stderr, proc.returncode)
    return proc


def best_effort(argv: Sequence[str], conf: str | None, timeout: float = 10.0) -> str | None:
    """Run a Slurm command that may fail harmlessly (a cancel, a step's end): its
    stdout, or None when it failed, timed out or is missing. Never raises: it runs on
    the way out, where Slurm may be slow to answer for a node that is gone."""
    try:
        proc = run(argv, conf, timeout=timeout, check=False)
    except SlurmError:
        return None
    return proc.stdout if proc.returncode == 0 else None


def failure(argv: Sequence[str], stderr: str, code: int) -> SlurmError:
    """The error of a failed Slurm command, from its stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    why = lines[-1] if lines else f"exit code {code}"
    said = why.lower()
    asked = ("invalid" in said and "credential" not in said) or any(
        words in said for words in REFUSALS
    )
    error = SlurmRefused if asked else SlurmError
    return error(f"{argv[0]} failed: {why}")


REFUSED_KEYS = (
    (r"accounting/qos policy", ("slurm",)),  # a limit: of the whole request
    (r"\baccount\b", ("slurm", "account")),  # "account/partition combination" too
    (r"\bpartition\b", ("slurm", "partition")),
    (r"\bqos\b", ("slurm", "qos")),
    (r"\btime limit\b", ("slurm", "time")),
    (r"\bmemory\b", ("slurm", "mem")),
    (r"\bnode count\b", ("slurm", "nodes")),
)
"""Words of a Slurm refusal (a regular expression, lower case), and the cluster
file's key it is about; the first that matches counts."""


def refused_key(message: str) -> tuple[str, ...]:
    """The ``slurm:`` key a refusal's ``message`` is about (``("slurm",)`` when its
    words name none)."""
    said = message.lower()
    return next((key for words, key in REFUSED_KEYS if re.search(words, said)), ("slurm",))
