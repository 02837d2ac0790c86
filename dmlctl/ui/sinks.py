"""Adapters from the supervisor's Sink interface to the ui/ renderers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, TextIO, cast

from rich.console import Console

from dmlctl.runs.events import Event
from dmlctl.runs.sink import Sink
from dmlctl.runs.state import RunState
from dmlctl.ui import LiveDashboard, PlainPrinter, render_summary

UiMode = Literal["auto", "live", "plain", "quiet"]


class LiveSink:
    """The rich Live dashboard, then the final summary."""

    def __init__(self, console: Console, run_dir: str) -> None:
        self._console = console
        self._run_dir = run_dir
        self._dash = LiveDashboard(console)
        self._dash.__enter__()

    def on_events(self, events: Sequence[Event], state: RunState) -> None:
        self._dash.update(state)

    def tick(self) -> None:
        self._dash.tick()

    def close(self, state: RunState) -> None:
        # The last frame stays on screen (header, ranks, root cause, log tail).
        self._dash.close(state)
        if state.stop_reason:
            self._console.print(f"stopped: {state.stop_reason}", markup=False)
        self._console.print(_where_logs_are(self._run_dir), markup=False)


class PlainSink:
    """Plain ``[rank N]`` lines for pipes and CI, then the final summary."""

    def __init__(self, console: Console, run_dir: str) -> None:
        self._console = console
        self._run_dir = run_dir
        self._printer = PlainPrinter(cast(TextIO, console.file))

    def on_events(self, events: Sequence[Event], state: RunState) -> None:
        self._printer.on_events(events, state)

    def tick(self) -> None:
        pass

    def close(self, state: RunState) -> None:
        present = os.path.isdir(self._run_dir)
        self._console.print(render_summary(state, self._run_dir if present else None))
        if not present:
            self._console.print(_where_logs_are(self._run_dir), markup=False)


class QuietSink:
    """``--ui quiet``: the run id when the run starts, the outcome when it ends (the
    summary line, stop reason, root cause and where the logs are; no rank table)."""

    def __init__(self, console: Console, run_dir: str) -> None:
        self._console = console
        self._run_dir = run_dir
        console.print(f"run {os.path.basename(run_dir.rstrip(os.sep))}", markup=False)

    def on_events(self, events: Sequence[Event], state: RunState) -> None:
        pass

    def tick(self) -> None:
        pass

    def close(self, state: RunState) -> None:
        present = os.path.isdir(self._run_dir)
        self._console.print(render_summary(state, self._run_dir if present else None, ranks=False))
        if not present:
            self._console.print(_where_logs_are(self._run_dir), markup=False)


def _where_logs_are(run_dir: str) -> str:
    if os.path.isdir(run_dir):
        return f"logs: {run_dir}/logs"
    return f"logs: none kept (the run directory {run_dir} was deleted)"


def make_sink(mode: UiMode, console: Console, run_dir: str) -> Sink:
    """``auto`` is ``live`` on a terminal and ``plain`` otherwise; ``quiet`` prints
    the run id and the outcome only."""
    if mode == "auto":
        mode = "live" if console.is_terminal else "plain"
    if mode == "live":
        return LiveSink(console, run_dir)
    if mode == "plain":
        return PlainSink(console, run_dir)
    return QuietSink(console, run_dir)
