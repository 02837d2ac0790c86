"""``launch``: the library call behind ``dmlctl launch`` (and ``dmlctl bench``).

Order of work, so that bad input never leaves anything behind: validate and plan
(pure) → pick transports (may refuse a host) → only then create the run directory,
record specs and plan, and start (foreground or detached).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel
from rich.console import Console

from dmlctl.launch.sinks import UiMode, make_sink
from dmlctl.launch.state import RunState, new_run_state
from dmlctl.plan.build import build_plan
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.render import render_plan
from dmlctl.runs.store import RunDir, RunStore, new_run_id
from dmlctl.spec.models import ClusterSpec, JobSpec
from dmlctl.transport import transport_for


@dataclass(frozen=True)
class LaunchOptions:
    detach: bool = False
    dry_run: bool = False
    ui: UiMode = "auto"
    home: Path | None = None
    job_file: Path | None = None
    cluster_file: Path | None = None


@dataclass(frozen=True)
class LaunchResult:
    """``run_dir`` is None for a dry run; ``state`` is None unless the run ran here."""

    run_id: str
    run_dir: Path | None
    state: RunState | None
    exit_code: int


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _record_spec(dest: Path, source: Path | None, model: BaseModel) -> None:
    if source is not None:
        shutil.copyfile(source, dest)
    else:
        dest.write_text(yaml.safe_dump(model.model_dump(mode="json"), sort_keys=False))


def plan_run(job: JobSpec, cluster: ClusterSpec, store: RunStore) -> LaunchPlan:
    """The plan for a new run id (pure apart from the id and the free port)."""
    run_id = new_run_id(job.name or "job", time.time())
    return build_plan(
        cluster,
        job,
        run_id=run_id,
        rdzv_port=free_port(),
        local_python=sys.executable,
        local_run_dir=str(store.root / run_id),
    )


def create_run(
    plan: LaunchPlan, job: JobSpec, cluster: ClusterSpec, store: RunStore, options: LaunchOptions
) -> RunDir:
    """Make the run directory with specs, plan and an initial state."""
    run = store.create(plan.run_id)
    _record_spec(run.specs / "job.yaml", options.job_file, job)
    _record_spec(run.specs / "cluster.yaml", options.cluster_file, cluster)
    run.write_json(run.plan, plan.to_dict())
    run.write_state(
        new_run_state(
            plan.run_id, plan.job_name, plan.strategy,
            [(r.rank, r.host, r.role) for r in plan.ranks], time.time(),
        )
    )
    return run


def _detach(run: RunDir) -> int:
    with open(run.controller_log, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dmlctl.launch.controller", str(run.path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    run.controller_pid.write_text(str(proc.pid))
    return proc.pid


def launch(
    job: JobSpec, cluster: ClusterSpec, *, options: LaunchOptions, console: Console
) -> LaunchResult:
    """Run ``job`` on ``cluster``; blocks until the run ends unless detached or dry.

    Exit code: 0 every rank succeeded, 1 the run failed, 130 stopped; raises
    DmlctlError (exit 2) for bad input before anything is created or started.
    """
    from dmlctl.launch.controller import run_controller

    store = RunStore(options.home)
    plan = plan_run(job, cluster, store)
    for host in plan.hosts:
        transport_for(host)  # refuse unreachable kinds of host before creating anything
    if options.dry_run:
        console.print(render_plan(plan), markup=False, highlight=False)
        return LaunchResult(plan.run_id, None, None, 0)
    run = create_run(plan, job, cluster, store, options)
    if options.detach:
        pid = _detach(run)
        return LaunchResult(plan.run_id, run.path, None, 0 if pid else 1)
    run.controller_pid.write_text(str(os.getpid()))
    sink = make_sink(options.ui, console, str(run.path))
    state = run_controller(run, plan, sink)
    return LaunchResult(plan.run_id, run.path, state, int(state.exit_code or 0))
