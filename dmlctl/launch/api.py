"""``launch``: the library call behind ``dmlctl launch`` (and ``dmlctl bench``).

Order of work, so that bad input never leaves anything behind and the dry run is
what a launch does: validate and place (pure, every plan-time refusal) → the
scheduler gathers the facts a plan needs (on SSH hosts: transports, the rendezvous
port on the first placed host, every host's preflight; a dry run assumes them and
connects to nothing) → one pure function makes the request (the plan and the steps
before the start) → ``--dry-run`` prints it, a launch hands exactly it to the
scheduler, which records the run and starts it (foreground or detached).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

from rich.console import Console

from dmlctl.errors import PlanError
from dmlctl.launch.options import LaunchOptions, LaunchResult
from dmlctl.launch.pick import scheduler_for
from dmlctl.launch.policy import NO_CHECKPOINT
from dmlctl.launch.start import detach
from dmlctl.plan.model import LaunchPlan
from dmlctl.plan.placing import JobPlacement, place_job
from dmlctl.plan.request import Facts, LaunchRequest, make_request, render_request, sized_slots
from dmlctl.runs.store import RunStore, new_run_id
from dmlctl.spec.local import local_checkpoint_problem, local_gpu_counts
from dmlctl.spec.locate import locate
from dmlctl.spec.models import ClusterSpec, JobSpec

__all__ = ["LaunchOptions", "LaunchResult", "detach", "launch", "plan_run"]


def plan_run(
    job: JobSpec,
    cluster: ClusterSpec,
    store: RunStore,
    *,
    port: int,
    run_id: str | None = None,
) -> LaunchPlan:
    """The plan of a run on this machine's facts with rendezvous ``port`` (default id:
    a new one); pure apart from making the id."""
    facts = Facts(port=port, local_python=sys.executable)
    placement = place_job(cluster, job)
    return _request(job, cluster, store, placement, facts, run_id).plan


def _request(
    job: JobSpec,
    cluster: ClusterSpec,
    store: RunStore,
    placement: JobPlacement,
    facts: Facts,
    run_id: str | None = None,
) -> LaunchRequest:
    run_id = run_id or new_run_id(job.name or "job", time.time())
    run_dir = str(store.root / run_id)
    return make_request(job, cluster, placement, facts, run_id=run_id, run_dir=run_dir)


def _place(job: JobSpec, cluster: ClusterSpec) -> JobPlacement:
    """Every plan-time check, before any host is touched (this machine's GPUs
    counted, as its ranks will see them; the checkpoint directory looked at here)."""
    if (problem := local_checkpoint_problem(job, cluster)) is not None:
        raise PlanError("job", ("checkpoint", "dir"), problem)
    return place_job(cluster, job, gpus=local_gpu_counts(job, cluster))


def fresh_restarts(job: JobSpec) -> str | None:
    """What a run of ``job`` should know before it starts: that its restarts begin at step
    0 (it may restart, and names no checkpoint); None otherwise."""
    budget = job.restart.max_user_restarts + job.restart.max_infra_restarts
    return NO_CHECKPOINT if job.checkpoint is None and budget > 0 else None


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


@contextlib.contextmanager
def _located(options: LaunchOptions) -> Iterator[None]:
    """A :class:`PlanError` raised inside becomes the user's error naming the spec
    file and line of the key at fault (or the flag that set it)."""
    try:
        yield
    except PlanError as e:
        files = (options.job_file, options.cluster_file)
        job_file, cluster_file = (os.fspath(f) if f is not None else None for f in files)
        raise locate(e, job_file, cluster_file, options.flags) from None


def launch(
    job: JobSpec, cluster: ClusterSpec, *, options: LaunchOptions, console: Console
) -> LaunchResult:
    """Run ``job`` on ``cluster``; blocks until the run ends unless detached or dry.

    Exit code: 0 every rank succeeded, 1 the run failed (or a host could not be made
    ready), 130 stopped; raises DmlctlError (exit 2) for bad input before anything is
    created or started. The job is placed and planned once (again only when probed
    GPUs set a host's slots, or Slurm grants fewer nodes than a range's most). A dry
    run prints the request and connects to nothing.
    """
    scheduler = scheduler_for(cluster, options, console)
    store = RunStore(options.home)
    with _located(options):
        placement = _place(job, cluster)
    if job.advice is not None:
        console.print(f"dmlctl: {job.advice}", markup=False, highlight=False)
    if (note := fresh_restarts(job)) is not None:
        _stderr().print(f"dmlctl: {note}", markup=False, highlight=False)
    try:
        with _located(options):  # a Slurm refusal names the key it is about
            facts = scheduler.gather(job, cluster, placement)
        if sized := sized_slots(cluster, facts):  # said before the job is placed on them
            said = ", ".join(f"{name}: {n}" for name, n in sized.items())
            _stderr().print(f"dmlctl: slots from the hosts' GPU counts ({said})", markup=False)
        with _located(options):
            request = _request(job, cluster, store, placement, facts)
    except BaseException:
        scheduler.release()
        raise
    if options.dry_run:
        console.print(render_request(request), markup=False, highlight=False, soft_wrap=True)
        return LaunchResult("", None, None, 0)
    return scheduler.schedule(request, job, cluster, store)
