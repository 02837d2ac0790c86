"""The allocation dmlctl itself runs inside (an sbatch script, an salloc shell), taken
for a run instead of asking for one (``slurm.allocation: enclosing``)."""

from __future__ import annotations

import os

from dmlctl.slurm.allocation import Allocation, Granted, hostnames, node_addresses, state
from dmlctl.slurm.commands import SlurmError
from dmlctl.text import plural

DEFAULT_CONF = "/etc/slurm/slurm.conf"


class TooFewNodes(SlurmError):
    """The enclosing allocation has fewer nodes than the cluster file asks for."""


def enclosing_job(conf: str | None) -> str | None:
    """The Slurm job this process runs inside (``SLURM_JOB_ID``: an sbatch script, an
    salloc shell), if any — and if it is a job of the cluster ``conf`` names (None:
    Slurm's own, the one this process's environment uses)."""
    value = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or ""
    if not value.isdigit():
        return None
    here = os.environ.get("SLURM_CONF") or DEFAULT_CONF
    same = conf is None or os.path.realpath(conf) == os.path.realpath(here)
    return value if same else None


def adopt(job_id: str, conf: str | None, need: int) -> Granted:
    """The running allocation ``job_id`` (the enclosing one) with its nodes, at least
    ``need`` of them; SlurmError when it does not run (a variable an ended one left
    behind), TooFewNodes when it has fewer."""
    now = state(job_id, conf)
    if now.state != "RUNNING":
        raise SlurmError(
            f"SLURM_JOB_ID says dmlctl runs inside Slurm job {job_id}, which is {now.said}"
        )
    nodes = hostnames(now.nodelist, conf)
    if len(nodes) < need:
        raise TooFewNodes(
            f"Slurm job {job_id}, which dmlctl runs inside, has {plural(len(nodes), 'node')}; "
            f"the cluster file asks for {need}"
        )
    return Granted(job_id, nodes, node_addresses(nodes, conf))


def require_nodes(where: Allocation, what: str) -> None:
    """UsageError (one line: ``what``, and where the job runs now) unless the
    allocation dmlctl ran inside still has the run's nodes (a batch script requeued
    by Slurm keeps its job id, not its nodes)."""
    from dmlctl.errors import UsageError

    try:
        now = hostnames(state(where.job_id, where.conf).nodelist, where.conf)
    except SlurmError as e:
        raise UsageError(f"{what}: Slurm does not say where job {where.job_id} runs: {e}") from None
    if missing := [n for n in where.nodes.values() if n not in now]:
        raise UsageError(
            f"{what}: Slurm job {where.job_id} runs on {', '.join(now) or 'no node'} now, "
            f"without the run's {', '.join(missing)} (requeued?)"
        )
