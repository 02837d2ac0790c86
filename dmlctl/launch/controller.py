"""The controller: runs a planned run to its end with signals wired to a clean stop.

Used in the foreground by ``dmlctl launch`` and, for ``--detach``, as its own
background process: ``python -m dmlctl.launch.controller RUN_DIR``.

Signals: SIGINT (Ctrl-C) and SIGTERM (``dmlctl stop``) ask for a stop — every agent
is told to stop and killed if it has not within the stop timeout; a second signal
kills the agents at once. SIGHUP (the terminal went away) stops the run too.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dmlctl.launch.end_warning import EndWarning
    from dmlctl.launch.requeue import Reallocation
    from dmlctl.launch.supervisor import Supervisor
    from dmlctl.plan.model import LaunchPlan
    from dmlctl.runs.sink import Sink
    from dmlctl.runs.state import RunState
    from dmlctl.runs.store import RunDir
    from dmlctl.slurm.allocation import Allocation
    from dmlctl.transport import Transport

_pending: list[str] = []
_REASONS = {
    signal.SIGINT: "interrupted (Ctrl-C)",
    signal.SIGTERM: "stopped (dmlctl stop)",
    signal.SIGHUP: "terminal closed",
}


def _early(signum: int, _frame: FrameType | None) -> None:
    _pending.append(_REASONS.get(signal.Signals(signum), "signal"))


def install_early_handlers() -> None:
    """Remember stop signals that arrive before the supervisor exists."""
    for sig in _REASONS:
        signal.signal(sig, _early)


def run_controller(
    run: RunDir,
    plan: LaunchPlan,
    sink: Sink,
    transports: Mapping[str, Transport] | None = None,
    resume_from: RunState | None = None,
) -> RunState:
    """Supervise ``plan`` in ``run`` and return the final RunState; afterwards, remote
    hosts' rank files are collected into the run directory."""
    from dmlctl.slurm.transport import transports_for
    from dmlctl.transport import close_transports

    if transports is None:
        where = _current(run, plan)
        transports = transports_for(plan.hosts + plan.spares, where)
    transports = dict(transports)  # the run's own: a new allocation swaps its entries
    previous: dict[signal.Signals, Callable[..., Any] | int | None] = {}
    try:
        sup = _supervisor(run, plan, sink, transports)

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            sup.request_stop(_REASONS.get(signal.Signals(signum), "signal"))

        for sig in _REASONS:
            previous[sig] = signal.signal(sig, on_signal)
        for reason in _pending:
            sup.request_stop(reason)
        warning = _end_warning(sup)
        try:
            state = sup.run(resume_from)
        finally:
            if warning is not None:
                warning.stop()
        _collect(sup, run, plan, transports)
        return state
    finally:
        close_transports(dict(transports))
        _release(run, plan)
        for restored, handler in previous.items():
            signal.signal(restored, handler if handler is not None else signal.SIG_DFL)


def _supervisor(
    run: RunDir, plan: LaunchPlan, sink: Sink, transports: dict[str, Transport]
) -> Supervisor:
    """The supervisor of ``plan``, with the job's ``restart:`` settings (the policy's
    budgets and backoff, hangs, lost hosts, standby agents) and checkpoint copies."""
    from dmlctl.launch.hosts import HostPool
    from dmlctl.launch.supervisor import Supervisor
    from dmlctl.provision.ports import probe_host, rendezvous_on
    from dmlctl.provision.replicate import Replicator, replicated
    from dmlctl.runs.events import CheckpointCopied
    from dmlctl.runs.redaction import redactor_of

    restart = plan.restart
    pool = HostPool(
        plan,
        lambda h: probe_host(h, transports[h.name]),
        wait=restart.host_wait,
        cooldown=restart.host_cooldown,
    )
    replicator = None
    if plan.checkpoint is not None and replicated(plan):
        checkpoints = run.path / "checkpoints"
        replicator = Replicator(checkpoints, transports, plan.hosts, keep=plan.checkpoint.keep)
    sup = Supervisor(
        plan,
        run,
        transports,
        sink,
        restart=restart,
        hang_timeout=restart.hang_timeout,
        stop_grace=restart.stop_grace,
        host_timeout=restart.host_timeout,
        hosts=pool,
        replicator=replicator,
        standby=restart.standby and restart.max_infra_restarts + restart.max_user_restarts > 0,
        rendezvous=lambda h: rendezvous_on(h, transports[h.name]),
        redactor=redactor_of(plan),
        reallocation=_reallocation(run, plan, transports),
    )
    if replicator is not None:
        replicator.on_copied = lambda step: sup.post(CheckpointCopied(step, time.time()))
    return sup


def _end_warning(sup: Supervisor) -> EndWarning | None:
    """The watch of a Slurm run's time limit, started (None: none asked for)."""
    from dmlctl.launch.end_warning import EndWarning

    realloc = sup.reallocation
    if realloc is None or realloc.where.warn_s <= 0:
        return None
    return EndWarning(realloc, sup.post).start()


def _collect(
    sup: Supervisor, run: RunDir, plan: LaunchPlan, transports: Mapping[str, Transport]
) -> None:
    """After the run: say what was not recorded, collect the remote hosts' rank files
    (unless the run directory is gone; not from a host still lost, which would only
    make the end wait for its timeout: ``dmlctl logs ID --fetch`` tries it later) and
    report the copies that failed."""
    from dmlctl.masking import mask_files
    from dmlctl.provision.collect import collect_rank_files
    from dmlctl.runs.files import RunDirGone
    from dmlctl.runs.redaction import redactor_of

    if sup.unrecorded is not None:
        print(f"dmlctl: the end of the run was not recorded: {sup.unrecorded}", file=sys.stderr)
    lost = set(sup.hosts.aside) if sup.hosts is not None else set()
    lost |= sup.attempts.lost_now  # the last attempt's (a host replaced in place, say)
    for name in sorted(lost & set(sup.hosts_used)):
        print(
            f"dmlctl: rank files of {name} not collected: the host was lost"
            f" (`dmlctl logs {run.run_id} --fetch` tries again)",
            file=sys.stderr,
        )
    reachable = tuple(h for name, h in sup.hosts_used.items() if name not in lost)
    used = dataclasses.replace(plan, hosts=reachable)
    gone = isinstance(sup.writer.failure, RunDirGone)
    for problem in [] if gone else collect_rank_files(used, transports, run.path):
        print(f"dmlctl: could not collect rank files from {problem}", file=sys.stderr)
    if not gone:  # the ranks' own files, as they wrote them: their secrets hidden now
        mask_files(run.path, redactor_of(plan))
    for problem in sup.replicator.problems if sup.replicator is not None else ():
        print(f"dmlctl: could not copy a checkpoint from {problem}", file=sys.stderr)


def main(argv: list[str]) -> int:
    """Entry point of a detached controller."""
    install_early_handlers()
    import os

    from rich.console import Console

    from dmlctl.runs.sink import NullSink
    from dmlctl.runs.store import RunDir
    from dmlctl.ui import render_summary

    run = RunDir(Path(argv[0]))
    resume_from = run.read_state() if "--resume" in argv[1:] else None
    run.write_pid(os.getpid())
    plan = run.read_plan()
    if resume_from is not None:  # on the nodes a requeue moved it to, if it was
        from dmlctl.launch.requeue import moved_plan

        plan = moved_plan(run.path, plan)
    # The run's lines are already in logs/; controller.log gets only the outcome.
    console = Console(file=sys.stdout, force_terminal=False, width=120)
    state = run_controller(run, plan, NullSink(), resume_from=resume_from)
    console.print(render_summary(state, str(run.path)))
    return int(state.exit_code or 0)


def _reallocation(
    run: RunDir, plan: LaunchPlan, transports: dict[str, Transport]
) -> Reallocation | None:
    """The run's Slurm allocation as it may change (None: the run has none)."""
    from dmlctl.launch.reprovision import preparer
    from dmlctl.launch.requeue import Reallocation

    where = _current(run, plan)
    if where is None:
        return None
    return Reallocation(run.path, where, transports, preparer(run, transports))


def _current(run: RunDir, plan: LaunchPlan) -> Allocation | None:
    """The run's Slurm allocation now (a requeue's, else the planned one)."""
    from dmlctl.slurm.record import recorded

    return recorded(run.path, plan.allocation)


def _release(run: RunDir, plan: LaunchPlan) -> None:
    """End the run's Slurm allocation, if it has one (it is the run's own), and one it
    asked for that still queues."""
    where = _current(run, plan)
    if where is not None:
        from dmlctl.slurm.allocation import cancel, finish
        from dmlctl.slurm.record import note_pending, pending

        finish(where)
        if (queued := pending(run.path)) is not None:
            cancel(queued, where.conf)
            note_pending(run.path, None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
