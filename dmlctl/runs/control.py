"""Stopping a run from another process (``dmlctl stop``), through its controller."""

from __future__ import annotations

import dataclasses
import json
import signal
import time

from dmlctl.runs.events import Finished, StopRequested
from dmlctl.runs.reducer import apply
from dmlctl.runs.state import Phase, RunState
from dmlctl.runs.store import RunDir

POLL_S = 0.1
STOP_SLACK_S = 10.0  # beyond the ranks' grace: the agents' margin and the teardown


def default_stop_timeout(run: RunDir) -> float:
    """How long ``dmlctl stop`` waits by default: the job's ``restart.stop_grace`` (from
    its plan; 30 s where it is unreadable) plus :data:`STOP_SLACK_S`."""
    try:
        plan = json.loads(run.plan.read_text(encoding="utf-8"))
        grace = float(plan.get("restart", {}).get("stop_grace", 30.0))
    except (OSError, ValueError, TypeError, AttributeError):
        grace = 30.0
    return grace + STOP_SLACK_S


def _mark_stopped(run: RunDir, state: RunState, why: str) -> RunState:
    now = time.time()
    state = dataclasses.replace(state, phase=Phase.RUNNING) if state.phase == Phase.LOST else state
    final = apply(state, [StopRequested(why, now), Finished(now)])
    run.write_state(final)
    run.write_summary(final)
    return final


def stop_run(run: RunDir, *, timeout: float) -> str:
    """Ask the run's controller to stop (SIGTERM) and wait up to ``timeout`` s for the
    run to end; a controller that does not end in time is killed (its host agents
    then stop their processes themselves). Returns a one-line outcome."""
    state = run.read_state()
    if state.phase.terminal and state.phase != Phase.LOST:
        return f"run {run.run_id} already ended: {state.phase.value}"
    controller = run.controller()
    if controller is None or not controller.signal(signal.SIGTERM):
        # gone, or its pid now names another process: nothing is signalled
        final = _mark_stopped(run, state, "controller was gone")
        return f"run {run.run_id}: controller was gone; marked {final.phase.value}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.read_state().phase.terminal or not controller.alive():
            break
        time.sleep(POLL_S)
    state = run.read_state()
    if state.phase.terminal and state.phase != Phase.LOST:
        return f"run {run.run_id} {state.phase.value}"
    if controller.signal(signal.SIGKILL):
        why = f"controller did not stop within {timeout:g} s and was killed"
    else:
        why = "controller exited without recording the end of the run"
    final = _mark_stopped(run, state, why)
    return f"run {run.run_id}: {why}; marked {final.phase.value}"
