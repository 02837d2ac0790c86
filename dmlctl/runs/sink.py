"""Where the supervisor's snapshots go: the interface, and a sink that drops them
(the renderers behind it are in :mod:`dmlctl.ui.sinks`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from dmlctl.runs.events import Event
from dmlctl.runs.state import RunState

__all__ = ["NullSink", "Sink"]


class Sink(Protocol):
    """Where snapshots go (dashboard, plain printer, nothing)."""

    def on_events(self, events: Sequence[Event], state: RunState) -> None: ...

    def tick(self) -> None:
        """Called about every 0.1 s, events or not (lets a live view advance its clock)."""
        ...

    def close(self, state: RunState) -> None: ...


class NullSink:
    def on_events(self, events: Sequence[Event], state: RunState) -> None:
        pass

    def tick(self) -> None:
        pass

    def close(self, state: RunState) -> None:
        pass
