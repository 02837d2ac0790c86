"""``dmlctl attach RUN``: the live dashboard of a run another process controls (a
``launch --detach``ed one, or one in another terminal), drawn from its run directory.

:func:`follow` re-reads ``state.json`` every ``poll_s`` seconds and draws it until the
run ends (then the final frame stays) or the user presses Ctrl-C (then it only
detaches: the run goes on). It never signals the run.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

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
    with _ctrl_c() as pressed, dash:
        try:
            while not state.phase.terminal and not pressed.is_set():
                dash.update(state)
                sleep(poll_s)
                state = run.read_state()
        except KeyboardInterrupt:
            pressed.set()
        dash.close(state)
    return state, not pressed.is_set()


@contextlib.contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """An event that Ctrl-C (SIGINT) sets, for as long as the block runs: a flag the
    loop reads, which no library code between two reads can swallow, as it can an
    exception."""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda _sig, _frame: pressed.set())
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)
