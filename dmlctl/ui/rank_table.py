"""The rank table at any width: columns by priority, never a truncated number.

Priorities: rank, state, step, loss and samples/s first; then the worker's place in
the device mesh (a job with ``parallelism:``), the strategy's own columns
(:mod:`dmlctl.ui.metric_columns`) and the role where roles differ; then epoch and the
columns every strategy has (comm/step, comm %, GPU memory); then host (and a role
all ranks share); the last line last. The table
is measured against the width it is given when rendered: a column that does not fit
drops out *whole*, lower priorities first, and ``last line`` takes what is left
(elided at its end, never wrapped), or goes when under :data:`MIN_LAST_LINE` cells
remain. The shown columns keep their reading order
(host, rank, role, mesh, state, step, loss, samples/s, epoch, strategy, last line).

Numbers are compact (:mod:`dmlctl.ui.numbers`): ``12.3k`` samples/s, ``3.4 MiB``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from dmlctl.runs.state import RankState

MIN_LAST_LINE = 12
GAP = 2  # cells between two columns (padding 1 on each side, no outer edge)

Cell = Callable[[RankState], RenderableType]


@dataclass(frozen=True)
class Column:
    """One column: its header, cell maker, priority (0 first) and alignment."""

    header: str
    cell: Cell
    priority: int
    justify: str = "right"
    meaning: str | None = None  # for the legend under the table, where it has one


def epoch_cell(rank: RankState) -> Text:
    """The epoch a rank reported (the runtime adds it to records), or ``-``."""
    value = rank.metrics.get("epoch")
    ok = isinstance(value, int) and not isinstance(value, bool)
    return Text(str(value) if ok else "-")


def pick_columns(
    widths: Sequence[int], priorities: Sequence[int], width: int, *, last_line: bool
) -> tuple[list[int], int]:
    """The columns to show in ``width`` cells, and the cells left for the last line.

    ``widths[i]`` is column ``i``'s full width (header and every cell, unsqueezed),
    ``priorities[i]`` its priority (0 first). Priority-0 columns are always shown, at
    full width, even past ``width``. Other columns are taken by priority, then by
    position, at full width, while they fit with :data:`GAP` cells between columns;
    once a column does not fit, no column of a *lower* priority is taken (a narrower
    one of the same priority still may), so a lower priority never shows in place
    of a higher one. Returns the chosen indices in position order and the width left
    for the last line: 0 when ``last_line`` is false or under :data:`MIN_LAST_LINE`.
    """
    order = sorted(range(len(widths)), key=lambda i: (priorities[i], i))
    chosen: list[int] = []
    used = 0
    stop_after: int | None = None
    for i in order:
        need = widths[i] + (GAP if chosen else 0)
        if priorities[i] == 0 or (
            (stop_after is None or priorities[i] <= stop_after) and used + need <= width
        ):
            chosen.append(i)
            used += need
        elif stop_after is None:
            stop_after = priorities[i]
    room = width - used - GAP
    return sorted(chosen), room if last_line and room >= MIN_LAST_LINE else 0


class RankTable:
    """A renderable choosing its columns for the width it gets (module docstring).
    ``last`` makes the last-line cell; ``caption`` goes under the table."""

    def __init__(
        self,
        ranks: Sequence[RankState],
        columns: Sequence[Column],
        last: Cell | None = None,
        caption: str | None = None,
        legend: bool = False,
        seen: dict[str, int] | None = None,
    ) -> None:
        self.ranks, self.columns, self.last, self.caption = (
            list(ranks),
            list(columns),
            last,
            caption,
        )
        #: Whether a dim line under the table says what the shown columns with a
        #: ``meaning`` mean.
        self.legend = legend
        #: The widest each column has been in the earlier frames of a live view (header →
        #: cells), updated here: a column is chosen at its widest, so one whose values
        #: widen and narrow again does not appear and vanish from frame to frame.
        self.seen = seen

    def _widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        widths = []
        for col in self.columns:
            cells = [console.measure(col.cell(r), options=options).maximum for r in self.ranks]
            width = max([len(col.header), *cells])
            if self.seen is not None:
                width = self.seen[col.header] = max(width, self.seen.get(col.header, 0))
            widths.append(width)
        return widths

    def pick(self, console: Console, options: ConsoleOptions) -> tuple[list[int], int]:
        """:func:`pick_columns` for these ranks at ``options.max_width``."""
        return pick_columns(
            self._widths(console, options),
            [col.priority for col in self.columns],
            options.max_width,
            last_line=self.last is not None,
        )

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        chosen, room = self.pick(console, options)
        table = Table(expand=False, pad_edge=False, box=None, header_style="bold")
        for i in chosen:
            col = self.columns[i]
            table.add_column(col.header, justify=col.justify, no_wrap=True)  # type: ignore[arg-type]
        if room:
            table.add_column("last line", no_wrap=True, overflow="ellipsis", max_width=room)
        for r in self.ranks:
            cells = [self.columns[i].cell(r) for i in chosen]
            if room and self.last is not None:
                line = self.last(r)
                if isinstance(line, Text):
                    line.truncate(room, overflow="ellipsis")
                cells.append(line)
            table.add_row(*cells)
        table.caption = self.caption
        yield table
        meant = [self.columns[i] for i in chosen if self.columns[i].meaning]
        if self.legend and meant:
            text = Text(style="dim")
            for n, col in enumerate(meant):
                text.append(" · " if n else "")
                text.append(col.header, style="bold")
                text.append(f": {col.meaning}")
            yield text
