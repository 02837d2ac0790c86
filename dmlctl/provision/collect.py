"""Each remote host's rank files, collected into the local run directory (best effort:
a host that is gone is reported, not fatal)."""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Mapping
from pathlib import Path

from dmlctl.plan.model import HostPlan, LaunchPlan
from dmlctl.runs.store import RunDir
from dmlctl.transport.base import Transport
from dmlctl.transport.fanout import problems

# Prints a base64 tar of argv[1] (a rank directory) on stdout.
_PACK = r"""
import base64, io, os, sys, tarfile
root = os.path.expanduser(sys.argv[1]); buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    if os.path.isdir(root):
        tar.add(root, arcname=".")
sys.stdout.write(base64.b64encode(buf.getvalue()).decode())
"""


def collect_rank_files(
    plan: LaunchPlan, transports: Mapping[str, Transport], run_dir: Path, timeout: float = 120.0
) -> list[str]:
    """Copy every remote host's rank directory into ``run_dir/hosts/<host>/``.

    Returns one problem line per host that could not be collected (nothing raised).
    """
    remote = [h for h in plan.hosts if not h.is_local]

    def fetch(host: HostPlan) -> str | None:
        res = transports[host.name].run([host.python, "-c", _PACK, host.rank_dir], timeout=timeout)
        if not res.ok:
            return f"{host.name}: {res.why()}"
        dest = run_dir / "hosts" / host.name
        try:
            dest.mkdir(mode=0o700, parents=True, exist_ok=True)
            data = base64.b64decode(res.stdout)
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(dest, filter="data")
        except (ValueError, tarfile.TarError, OSError) as e:
            return f"{host.name}: cannot unpack rank files: {e}"
        return None

    return problems(remote, fetch)


def fetch_rank_files(run: RunDir) -> list[str]:
    """:func:`collect_rank_files` for a finished run, from its ``plan.json``; local
    hosts' files are already in the run directory. The copies get the run's secrets
    hidden (:func:`~dmlctl.masking.mask_files`)."""
    from dmlctl.masking import mask_files
    from dmlctl.runs.redaction import redactor_of
    from dmlctl.slurm.record import recorded
    from dmlctl.slurm.transport import transports_for
    from dmlctl.transport import close_transports

    plan = run.read_plan()
    where = recorded(run.path, plan.allocation)  # a requeue's nodes, where it moved
    transports = transports_for((h for h in plan.hosts if not h.is_local), where)
    try:
        return collect_rank_files(plan, transports, run.path)
    finally:
        close_transports(transports)
        mask_files(run.path, redactor_of(plan))
