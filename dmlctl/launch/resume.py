"""``dmlctl launch --resume RUN``: a run whose controller died, or that failed for a
full disk, goes on from its latest checkpoints under a new controller."""

from __future__ import annotations

import os

from rich.console import Console

from dmlctl.checkpoint_claim import CheckpointInUse, release
from dmlctl.failure import Kind
from dmlctl.launch.api import LaunchOptions, LaunchResult, detach
from dmlctl.launch.requeue import moved_plan
from dmlctl.launch.start import claim_checkpoints
from dmlctl.runs.files import private_umask
from dmlctl.runs.store import RunStore
from dmlctl.slurm.transport import transports_for
from dmlctl.transport import close_transports
from dmlctl.ui.sinks import make_sink


def resume(run_id: str, *, options: LaunchOptions, console: Console) -> LaunchResult:
    """Continue run ``run_id`` whose controller died (``dmlctl status`` says ``lost``),
    or that failed with ``DiskFull`` once space was freed:
    the same plan, as its next attempt, in the foreground or detached; the ranks
    resume from their latest checkpoints. Agents the dead controller left running (a
    host cut off keeps its agent until the connection times out) are stopped first.
    Refuses a run that is still controlled or already ended."""
    from dmlctl.errors import UsageError
    from dmlctl.launch.controller import run_controller
    from dmlctl.runs.state import Phase

    run = RunStore(options.home).get(run_id)
    state = run.read_state()
    disk_full = (
        state.phase == Phase.FAILED
        and state.root_cause is not None
        and state.root_cause.kind is Kind.DISK_FULL
    )
    if state.phase != Phase.LOST and not disk_full:
        raise UsageError(
            f"run {run.run_id} is {state.phase.value}; only a run whose controller died"
            " ('lost' in dmlctl status) or that failed for a full disk can be resumed"
        )
    plan = run.read_plan()
    plan = moved_plan(run.path, plan)
    if plan.allocation is not None:
        from dmlctl.slurm.allocation import require_live

        require_live(plan.allocation, f"run {run.run_id} cannot be resumed")
        if not plan.allocation.owned:  # the one dmlctl ran inside: its nodes may be others
            from dmlctl.slurm.enclosing import require_nodes

            require_nodes(plan.allocation, f"run {run.run_id} cannot be resumed")
    transports = transports_for(plan.hosts + plan.spares, plan.allocation)
    from dmlctl.provision.agents import stop_stale_agents

    for line in stop_stale_agents(plan.run_id, plan.hosts + plan.spares, transports):
        console.print(f"dmlctl: {line}", markup=False, highlight=False)
    try:
        claims = claim_checkpoints(plan)
    except CheckpointInUse:
        close_transports(transports)
        raise
    with private_umask():
        try:
            if options.detach:
                close_transports(transports)
                pid = detach(run, resume=True, claims=claims)
                return LaunchResult(plan.run_id, run.path, None, 0 if pid else 1)
            run.write_pid(os.getpid())
            sink = make_sink(options.ui, console, str(run.path))
            final = run_controller(run, plan, sink, transports, resume_from=state)
        finally:
            release(*claims)
    return LaunchResult(plan.run_id, run.path, final, int(final.exit_code or 0))
