"""Line-oriented output for non-terminals (CI logs, pipes, ``| tee``).

No colours, no cursor movement: every line stands alone and is grep-able. What a rank
printed goes through :func:`~dmlctl.text.clean_line`: colours dropped, other
control characters shown escaped (``\\x1b``), so no rank can retitle, move or
reprogram the user's terminal; the rank's log file keeps the bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TextIO

from dmlctl.runs.events import (
    AgentExited,
    AgentStarted,
    Event,
    Finished,
    LogLines,
    Progress,
    RankExited,
    RankRespawned,
    RankStarted,
    Restarting,
    StopRequested,
    Stream,
)
from dmlctl.runs.state import RankState, RunState
from dmlctl.text import clean_line
from dmlctl.ui.format import format_duration, format_loss, format_step
from dmlctl.ui.numbers import compact_rate
from dmlctl.ui.progress import no_metrics_hint, progress_line, run_progress

_Snapshot = tuple[int | None, float | None, float | None]


class PlainPrinter:
    """Prints a run's events as plain lines to ``out``.

    Line formats (one event, one line), after a first line naming the run
    (``dmlctl: run ID (job NAME, strategy S)``):

    * log lines: ``[rank N] text``, or ``[host] text`` when no rank sent it (agent);
    * controller progress: ``dmlctl: text``;
    * ranks and agents: ``dmlctl: rank 1 started on local (worker, pid 42)``,
      ``dmlctl: rank 1 on local exited with code 1``, ``dmlctl: agent on local exited …``;
    * a restart and its cause: ``dmlctl: rank 1 on local: Signal: killed by SIGKILL:
      restart 1 in 1 s``;
    * metrics: at most once every ``summary_interval`` seconds (by ``clock``, counted
      from construction), ``dmlctl: rank N step S loss L samples/s R`` for each rank
      whose step, loss or rate changed since the last summary; a final summary is
      printed when the run finishes, whatever the interval. The outcome itself is
      the run summary's first line (``run … succeeded in 0:00:12  exit code 0``,
      printed once by the sink after this printer's last line).

    Each :meth:`on_events` call writes one string and flushes once, so tens of
    thousands of lines per second cost little. Not thread-safe.
    """

    def __init__(
        self,
        out: TextIO,
        summary_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out
        self._interval = summary_interval
        self._clock = clock
        self._last_summary_at = clock()
        self._progress_pct = -1  # the last progress printed, in whole percent
        self._reported: dict[int, _Snapshot] = {}
        self._headed = False
        self._hinted = False  # the no-metrics hint: said once

    def on_events(self, events: Sequence[Event], state: RunState) -> None:
        """Print ``events`` (already folded into ``state``) and a summary if one is due;
        the first call starts with the run's id."""
        buf: list[str] = []
        emit = buf.append
        if not self._headed:
            self._headed = True
            emit(f"dmlctl: run {state.run_id} (job {state.job}, strategy {state.strategy_label()})")
        finished = False
        for ev in events:
            if isinstance(ev, LogLines) and ev.stream is not Stream.TORCHRUN:
                who = f"[rank {ev.rank}] " if ev.rank is not None else f"[{ev.host}] "
                buf.extend(who + clean_line(text) for text in ev.lines)
            elif isinstance(ev, Progress):
                emit(f"dmlctl: {ev.text}")
            elif isinstance(ev, RankStarted):
                emit(f"dmlctl: rank {ev.rank} started on {ev.host} ({ev.role}, pid {ev.pid})")
            elif isinstance(ev, RankRespawned):
                emit(f"dmlctl: rank {ev.rank} on {ev.host} {ev.cause.message} (pid {ev.pid})")
            elif isinstance(ev, RankExited):
                line = f"dmlctl: rank {ev.rank} on {ev.host} exited with code {ev.exit_code}"
                if ev.cause is not None:
                    line += f": {ev.cause.exc_type}: {clean_line(ev.cause.message)}"
                emit(line)
            elif isinstance(ev, AgentStarted):
                emit(f"dmlctl: agent started on {ev.host} (pid {ev.pid})")
            elif isinstance(ev, AgentExited):
                emit(f"dmlctl: agent on {ev.host} exited with code {ev.exit_code}")
            elif isinstance(ev, Restarting):
                line = f"{clean_line(ev.cause.headline())}: restart {ev.attempt} in {ev.delay:g} s"
                emit(f"dmlctl: {line}")
            elif isinstance(ev, StopRequested):
                emit(f"dmlctl: stopping: {ev.reason}")
            elif isinstance(ev, Finished):
                finished = True
        if not self._hinted and (hint := no_metrics_hint(state, time.time())) is not None:
            self._hinted = True
            emit(f"dmlctl: {hint}")
        now = self._clock()
        if finished or now - self._last_summary_at >= self._interval:
            self._last_summary_at = now
            buf.extend(self._summary_lines(state.ranks))
            buf.extend(self._progress_line(state))
        if buf:
            buf.append("")
            self._out.write("\n".join(buf))
            self._out.flush()

    def _progress_line(self, state: RunState) -> list[str]:
        """``dmlctl: progress 45%  epoch 3  ETA 0:01:23`` when the run's progress
        moved by a percent since the last one printed."""
        line = progress_line(state, time.time(), format_duration, with_bar=False)
        done = run_progress(state)
        if line is None or done is None or int(done * 100) == self._progress_pct:
            return []
        self._progress_pct = int(done * 100)
        return [f"dmlctl: {line.plain}"]

    def _summary_lines(self, ranks: Sequence[RankState]) -> list[str]:
        lines = []
        for r in ranks:
            snap: _Snapshot = (r.step, r.loss, r.samples_per_s)
            if snap == (None, None, None) or self._reported.get(r.rank) == snap:
                continue
            self._reported[r.rank] = snap
            lines.append(
                f"dmlctl: rank {r.rank} step {format_step(r.step)} loss {format_loss(r.loss)}"
                f" samples/s {compact_rate(r.samples_per_s)}"
            )
        return lines
