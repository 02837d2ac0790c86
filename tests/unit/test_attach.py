"""``follow``: draws a run from its states until it ends, or detaches on Ctrl-C."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from rich.console import Console

from dmlctl.runs.state import RunState
from dmlctl.ui.attach import follow
from tests.unit.test_runs import finished_state, running_state


class Run:
    """A run directory whose state.json the test rewrites: one state per read."""

    def __init__(self, states: list[RunState]) -> None:
        self.states = states

    def read_state(self) -> RunState:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def test_follow_draws_until_the_run_ends() -> None:
    run = Run([running_state("r"), running_state("r"), finished_state("r")])
    console = Console(record=True, width=100, color_system=None)
    state, ended = follow(run, console, sleep=lambda _s: None)  # type: ignore[arg-type]
    assert ended and state.phase.value == "succeeded"
    assert "succeeded" in console.export_text()


def test_ctrl_c_only_detaches() -> None:
    def interrupt(_s: float) -> Any:
        raise KeyboardInterrupt

    run = Run([running_state("r")])
    console = Console(record=True, width=100, color_system=None)
    state, ended = follow(run, console, sleep=interrupt)  # type: ignore[arg-type]
    assert not ended and state.phase.value == "running"


def test_a_ctrl_c_that_library_code_swallows_still_detaches() -> None:
    """SIGINT sets a flag the loop reads: even where an exception would have been
    caught on the way (here: it never becomes one), the next read sees it."""

    def ctrl_c_during_a_read(_s: float) -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # the handler runs here
        except KeyboardInterrupt:  # what a library's broad except would swallow
            pass

    before = signal.getsignal(signal.SIGINT)
    run = Run([running_state("r")])
    console = Console(record=True, width=100, color_system=None)
    state, ended = follow(run, console, sleep=ctrl_c_during_a_read)  # type: ignore[arg-type]
    assert not ended and state.phase.value == "running"
    assert signal.getsignal(signal.SIGINT) is before  # the user's handler is back
