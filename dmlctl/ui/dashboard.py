"""The live terminal dashboard: one view of every rank of a run, redrawn at a bounded rate.

:func:`render_dashboard` is a pure function of a :class:`RunState` snapshot and the
current wall-clock time. :class:`LiveDashboard` owns the terminal while a run is
attached and redraws at most ``max_fps`` times per second however often it is fed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.rule import Rule
from rich.text import Text

from dmlctl.runs.state import Phase, RunState
from dmlctl.ui.format import rank_table, root_cause_panel, run_header, tail_text
from dmlctl.ui.progress import no_metrics_hint

SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SPINNER_FPS = 8.0
FINAL_LINES_AFTER = 3
"""Terminal lines kept free under the final frame: the ``logs:`` line, a possible
``stopped:`` line, and the shell's prompt."""
LOG_LINES_BESIDE_LEGEND = 4
"""The columns' legend is drawn only where this many log lines fit under it too."""
MAX_RANK_ROWS = 32
"""Rank rows drawn by the dashboard; failed ranks are kept first beyond this."""


def spinner_frame(now: float) -> str:
    """The spinner character for time ``now``: a pure function of the clock value."""
    return SPINNER_FRAMES[int(now * SPINNER_FPS) % len(SPINNER_FRAMES)]


def render_dashboard(
    state: RunState,
    now: float,
    *,
    tail_lines: int = 12,
    max_rank_rows: int | None = MAX_RANK_ROWS,
    legend: bool = True,
    seen: dict[str, int] | None = None,
) -> RenderableType:
    """The whole dashboard for ``state`` at wall-clock time ``now``.

    Shows, top to bottom: the run header (run id, job, strategy, coloured phase,
    ``H:MM:SS`` elapsed, restarts, world size, the progress ``detail`` with a spinner
    while the run is pending or starting), one row per rank (at most
    ``max_rank_rows``, failed ranks kept first; with a device mesh, each worker's
    place in it), with ``legend`` a dim line saying what each strategy column means,
    the root-cause panel when the run has
    one, and the last ``tail_lines`` lines of the merged log with ``[rank N]`` /
    ``[host]`` prefixes. Pure: no I/O, no clock reads; cost is linear in the number
    of ranks shown plus ``tail_lines``.
    """
    spinning = state.phase in (Phase.PENDING, Phase.STARTING)
    parts: list[RenderableType] = [
        run_header(state, now, marker=spinner_frame(now) if spinning else None),
        Text(""),
        rank_table(state.ranks, max_rows=max_rank_rows, mesh=state.mesh, legend=legend, seen=seen),
    ]
    if (hint := no_metrics_hint(state, now)) is not None:
        parts.append(Text(hint, style="dim"))
    if state.root_cause is not None:
        parts.append(root_cause_panel(state.root_cause, max_lines=10))
    if tail_lines > 0 and state.tail:
        parts.append(Rule("log", align="left", style="dim"))
        parts.extend(tail_text(line) for line in state.tail[-tail_lines:])
    return Group(*parts)


def fitting_view(
    state: RunState,
    now: float,
    console: Console,
    height: int,
    tail_lines: int,
    seen: dict[str, int] | None = None,
) -> RenderableType:
    """:func:`render_dashboard` at most ``height`` lines tall at ``console``'s width:
    the log tail is shortened first (to none, with its rule), then the columns'
    legend goes, then rank rows (failed ranks first, the caption counting the rest;
    at least one row). Taller only when one rank row and the header alone do not fit.
    The legend is shown only where :data:`LOG_LINES_BESIDE_LEGEND` log lines fit too.

    A frame taller than the terminal is cropped by rich, and its top line scrolls out
    of reach, so the next frame is drawn under a stale copy of it: the duplicated
    header after Ctrl-C in a short terminal.
    """
    rows = MAX_RANK_ROWS
    keep = min(LOG_LINES_BESIDE_LEGEND, tail_lines, len(state.tail))
    for legend in (True, False):
        while True:
            bare = render_dashboard(
                state, now, tail_lines=0, max_rank_rows=rows, legend=legend, seen=seen
            )
            used = len(console.render_lines(bare, console.options, pad=False))
            if used <= height or rows <= 1:
                break
            rows = max(1, min(rows, len(state.ranks)) - (used - height))
        if not legend or used + (keep + 1 if keep else 0) <= height:
            break
        rows = MAX_RANK_ROWS
    room = min(tail_lines, height - used - 1)  # the ``log`` rule takes a line
    if room <= 0 or not state.tail:
        return bare
    return render_dashboard(
        state, now, tail_lines=room, max_rank_rows=rows, legend=legend, seen=seen
    )


class LiveDashboard:
    """Context manager that shows :func:`render_dashboard` in a :class:`rich.live.Live`.

    Promises:

    * :meth:`update` is cheap: it stores the snapshot and renders only when at least
      ``1 / max_fps`` seconds (by ``clock``) have passed since the last frame, so
      calling it thousands of times per second costs almost nothing.
    * The latest snapshot is never lost: a skipped update is drawn by the next call
      that is due (:meth:`update` or :meth:`tick`) and always by :meth:`close`.
    * :meth:`close` draws the final state exactly once and releases the terminal;
      the last frame stays on screen (``transient=False``).
    * No frame is taller than the terminal (:func:`fitting_view`).

    Not thread-safe: feed it from one thread (the supervisor loop). There is no
    background refresh thread, so a caller waiting for events should call
    :meth:`tick` now and then to keep the elapsed clock moving.
    """

    def __init__(
        self,
        console: Console,
        *,
        max_fps: float = 4.0,
        tail_lines: int = 12,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock`` paces frames; ``wall_clock`` is the ``now`` given to the renderer."""
        if max_fps <= 0:
            raise ValueError(f"max_fps must be positive, got {max_fps}")
        self._live = Live(console=console, auto_refresh=False, transient=False)
        self._interval = 1.0 / max_fps
        self._tail_lines = tail_lines
        self._clock = clock
        self._wall_clock = wall_clock
        self._state: RunState | None = None
        self._next_frame_at = float("-inf")
        self._frames = 0
        self._seen: dict[str, int] = {}  # each column's widest so far (stable columns)
        self._closed = False

    @property
    def frames(self) -> int:
        """How many frames were rendered so far (for tests and overhead benchmarks)."""
        return self._frames

    def __enter__(self) -> LiveDashboard:
        self._live.start(refresh=False)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._closed:
            if self._state is not None:
                self._draw()
            self._closed = True
            self._live.stop()

    def update(self, state: RunState) -> None:
        """Remember ``state`` and draw it if a frame is due; otherwise return at once."""
        self._state = state
        self.tick()

    def tick(self) -> None:
        """Draw the latest snapshot if a frame is due (keeps the elapsed time moving)."""
        if self._closed or self._state is None:
            return
        now = self._clock()
        if now < self._next_frame_at:
            return
        self._next_frame_at = now + self._interval
        self._draw()

    def close(self, final: RunState) -> None:
        """Draw ``final`` once, whatever the rate limit, and release the terminal.

        The final frame stays on screen in full, with :data:`FINAL_LINES_AFTER` lines
        left below it (:func:`fitting_view`).
        """
        if self._closed:
            return
        self._state = final
        self._draw(final=True)
        self._closed = True
        self._live.stop()

    def _draw(self, *, final: bool = False) -> None:
        """One frame that fits the terminal (:func:`fitting_view`): one line short of
        it while live (a full-height frame would scroll), :data:`FINAL_LINES_AFTER`
        short for the final one."""
        assert self._state is not None  # callers check; not user input
        console = self._live.console
        height = console.height - (FINAL_LINES_AFTER if final else 1)
        view = fitting_view(
            self._state, self._wall_clock(), console, height, self._tail_lines, self._seen
        )
        self._live.update(view, refresh=True)
        self._frames += 1
