"""The allocation dmlctl itself runs inside (an sbatch script, an salloc shell), taken
for a run instead of asking for one (``slurm.allocation: enclosing``)."""

from __future__ import annotations

import os

from dmlctl.slurm.allocation import Granted, hostnames, node_addresses, state
from dmlctl.slurm.commands import SlurmError
from dmlctl.text import plural


def enclosing_job() -> str | None:
    """The Slurm job this process runs inside (``SLURM_JOB_ID``: an sbatch script, an
    salloc shell), if any."""
    value = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or ""
    return value if value.isdigit() else None


def adopt(job_id: str, conf: str | None, need: int) -> Granted:
    """The running allocation ``job_id`` (the enclosing one) with its nodes, at least
    ``need`` of them; SlurmError when it does not run or has fewer."""
    now = state(job_id, conf)
    if now.state != "RUNNING":
        raise SlurmError(f"Slurm job {job_id}, which dmlctl runs inside, is {now.said}")
    nodes = hostnames(now.nodelist, conf)
    if len(nodes) < need:
        raise SlurmError(
            f"Slurm job {job_id}, which dmlctl runs inside, has {plural(len(nodes), 'node')}; "
            f"the cluster file asks for {need}"
        )
    return Granted(job_id, nodes, node_addresses(nodes, conf))
