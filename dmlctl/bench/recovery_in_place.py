"""The in-place side of ``dmlctl bench recovery --mode in_place``.

A real run through :func:`dmlctl.launch.api.launch` of ``recovery_job/train_ps.py``
(the recovery benchmark's tiny model and per-step sleep, under ``asgd`` by default:
2 workers, 1 parameter server; ``--in-place-strategy`` another strategy that can
replace a worker in place, with a server only if it has servers) with
``restart: {mode: in_place}``, :data:`STEPS` steps per
worker. On the first attempt worker rank :data:`~dmlctl.bench.recovery_timing.KILL_RANK`
records the time and SIGKILLs itself right after step :data:`KILL_AT` (about 8 s
into training, so that :data:`~dmlctl.bench.recovery_timing.SURVIVOR_WINDOW_S`
seconds of the other worker's steps lie on either side of the kill). Its torchrun
forks it again alone; the replacement pulls the servers' model and goes on from its
data position. The run must succeed with one rank replaced and no restart.

Measured from the script's timing lines (:func:`measure_recovery` with
``in_place``): the seconds from the kill to the replacement's first step, the steps
the killed worker lost (its step at the kill − where its replacement went on) and
the other worker's steps/s in the 10 s after the kill ÷ the 10 s before.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from dmlctl.bench.recovery_timing import (
    JOB_DIR,
    KILL_RANK,
    STEP_SLEEP_S,
    Recovery,
    RecoveryBenchFailed,
    local_cluster,
    measure_recovery,
    read_timing_dir,
    script_argv,
)
from dmlctl.bench.runs import launch_bench
from dmlctl.spec import ClusterSpec, JobSpec
from dmlctl.spec.models import uses_servers
from dmlctl.text import plural

SCRIPT = "train_ps.py"
JOB_NAME = "bench-recovery-in-place"
STRATEGY = "asgd"
WORKERS, SERVERS = 2, 1
STEPS = 450
KILL_AT = 150


def in_place_job(work: Path, strategy: str = STRATEGY, ranks: str = "fresh") -> JobSpec:
    """The job of one in-place run of ``strategy`` (with one parameter server when
    it has servers) whose timing files go under ``work``, its ranks started as
    ``ranks``."""
    args = {
        "--timing-dir": work / "timing",
        "--steps": STEPS,
        "--kill-at": KILL_AT,
        "--kill-rank": KILL_RANK,
        "--sleep": STEP_SLEEP_S,
    }
    return JobSpec.model_validate(
        {
            "name": JOB_NAME,
            "script": SCRIPT,
            "args": script_argv(args),
            "workers": WORKERS,
            "parameter_servers": SERVERS if uses_servers(strategy) else 0,
            "strategy": strategy,
            "workdir": str(JOB_DIR),
            "restart": {"mode": "in_place"},
            "ranks": {"start": ranks},
        }
    )


def in_place_cluster() -> ClusterSpec:
    """This machine as host ``local`` with a slot for every worker and server."""
    return local_cluster(WORKERS + SERVERS)


def run_in_place(
    work: Path,
    *,
    home: Path,
    console: Console,
    strategy: str = STRATEGY,
    cluster: ClusterSpec | None = None,
    ranks: str = "fresh",
) -> Recovery:
    """One in-place run of :func:`in_place_job` (its ranks started as ``ranks``) on
    ``cluster`` (default
    :func:`in_place_cluster`); its recovery. Raises
    :class:`RecoveryBenchFailed` unless the run succeeded with exactly one rank
    replaced in place and no restart."""
    job = in_place_job(work, strategy, ranks)
    on = cluster or in_place_cluster()
    result = launch_bench(job, on, console=console, home=home, check=False)
    state = result.state
    if state is None or result.exit_code != 0 or (state.restarts, state.respawns) != (0, 1):
        root = state.root_cause if state is not None else None
        why = root.headline() if root is not None else f"exit code {result.exit_code}"
        counts = (
            f"{plural(state.respawns, 'rank')} replaced, {plural(state.restarts, 'restart')}"
            if state is not None
            else "no state"
        )
        raise RecoveryBenchFailed(
            f"dmlctl run {result.run_id} did not recover in place: {why}, {counts}"
        )
    found = measure_recovery(read_timing_dir(work / "timing"), in_place=True)
    cause = state.failures[0].headline() if state.failures else ""
    return dataclasses.replace(found, cause=cause)
