"""What the current attempt learns from every event before it is reduced
(:class:`AttemptNotes`)."""

from __future__ import annotations

from dmlctl.hangs.rules import start_limit
from dmlctl.hangs.watch import HangProbe, HangWatch
from dmlctl.runs.events import (
    Event,
    Heartbeat,
    MetricRecord,
    ProcSample,
    RankExited,
    StackDump,
    StacksDumped,
)
from dmlctl.runs.stderr_tail import StderrTails


class AttemptNotes:
    """What the current attempt learns from every event before it is reduced: each
    rank's stderr tail (put into root causes that lack a traceback), and the hang
    watch's beats, exits and samples, and the stack dumps a hang verdict waits for."""

    def __init__(
        self, hang_timeout: float | None, start_timeout: float | None = None, world_size: int = 1
    ) -> None:
        """``start_timeout``: the job's ``restart.start_timeout`` (None: its default for
        ``world_size`` ranks, :func:`~dmlctl.hangs.rules.start_limit`); no hang is judged
        without a ``hang_timeout``."""
        starts = start_limit(start_timeout, world_size) if hang_timeout is not None else None
        self.hangs = HangWatch(hang_timeout, start_timeout=starts)
        self.probe: HangProbe | None = None  # a hang verdict waiting for stack dumps
        self._stderr = StderrTails()

    def reset(self) -> None:
        """Forget the previous attempt (its stderr tails, beats and hang verdict)."""
        self._stderr = StderrTails()
        self.hangs.reset()
        self.probe = None

    def __call__(self, batch: list[Event]) -> list[Event]:
        """``batch`` with stderr tails attached to causes; every event noted."""
        batch = self._stderr.attach(batch)
        for ev in batch:
            if isinstance(ev, Heartbeat):
                self.hangs.beat(ev)
            elif isinstance(ev, RankExited):
                self.hangs.exited(ev)
            elif isinstance(ev, ProcSample):
                self.hangs.sample(ev)
            elif isinstance(ev, MetricRecord):
                self.hangs.recorded(ev)
            elif isinstance(ev, (StackDump, StacksDumped)) and self.probe is not None:
                self.probe.take(ev)
        return batch
