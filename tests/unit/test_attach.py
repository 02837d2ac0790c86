"""``follow``: draws a run from its states until it ends, or detaches on Ctrl-C."""

from __future__ import annotations

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
