"""A Slurm run's new nodes made ready after a requeue, as a launch makes its hosts
ready: the job's directory and dmlctl's library synced to them, and the job's
``setup`` run there. The job is read back from the run's record of it
(``specs/job.yaml``: its directory, excludes and setup as validated at launch; a setup
stored redacted is taken from ``secrets.json``, as the env values are)."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping

from rich.console import Console

from dmlctl.plan.model import LaunchPlan
from dmlctl.runs.store import RunDir
from dmlctl.transport.base import Transport


def preparer(run: RunDir, transports: Mapping[str, Transport]) -> Callable[[LaunchPlan], None]:
    """What readies ``plan``'s hosts (reached through ``transports``, which a requeue
    updates in place) for run ``run``; it raises DmlctlError naming each host whose
    sync or setup failed. Its progress is not shown: the dashboard holds the terminal."""

    def prepare(plan: LaunchPlan) -> None:
        from dmlctl.provision import ship
        from dmlctl.spec.loader import load_job

        job = load_job(run.specs / "job.yaml")
        if (real := run.real_setup()) is not None:
            job = job.model_copy(update={"setup": real})
        quiet = Console(file=io.StringIO(), width=120)
        ship.sync_code(plan, job, transports, quiet)
        ship.run_setup(plan, job, transports, quiet)

    return prepare
