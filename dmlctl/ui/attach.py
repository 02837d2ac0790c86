"""``dmlctl attach RUN``: the live dashboard of a run another process controls (a
``launch --detach``ed one, or one in another terminal), drawn from its run directory.

:func:`follow` re-reads ``state.json`` every ``poll_s`` seconds and draws it until the
run ends (then the final frame stays) or the user presses Ctrl-C (then it only
detaches: the run goes on). It never signals the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console

from dmlctl.runs.state import RunState
from dmlctl.runs.store import RunDir
from dmlctl.ui.dashboard import LiveDashboard

POLL_S = 0.25


def follow(
    run: RunDir,
    console: Console,
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[RunState, bool]:
    """Draw ``run`` live until it ends or Ctrl-C; returns the last state read and
    whether the run ended (False: the user detached)."""
    state = run.read_state()
    dash = LiveDashboard(console)
    with dash:
        try:
            while not state.phase.terminal:
                dash.update(state)
                sleep(poll_s)
                state = run.read_state()
        except KeyboardInterrupt:
            dash.close(state)
            return state, False
        dash.close(state)
    return state, True
