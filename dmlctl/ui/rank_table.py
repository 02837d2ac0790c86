"""The rank table at any width: columns by priority, never a truncated number.

Priorities: rank, state, step, loss and samples/s first; then epoch and the
strategy's columns (:mod:`dmlctl.ui.metric_columns`); then host and role; the last
line last. The table is measured against the width it is given when rendered: a
column that does not fit drops out *whole*, lower priorities first, and ``last line``
takes what is left (elided at its end, never wrapped), or goes when under
:data:`MIN_LAST_LINE` cells remain. The shown columns keep their reading order
(host, rank, role, state, step, loss, samples/s, epoch, strategy, last line).

Numbers are compact: ``12.3k`` samples/s.
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


def compact_rate(value: float | None) -> str:
    """``950.3``, ``12.3k``, ``4.1M`` samples/s, or ``-``."""
    if value is None:
        return "-"
    for limit, unit in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{unit}"
    return f"{value:.1f}"


def epoch_cell(rank: RankState) -> Text:
    """The epoch a rank reported (the runtime adds it to records), or ``-``."""
    value = rank.metrics.get("epoch")
    ok = isinstance(value, int) and not isinstance(value, bool)
    return Text(str(value) if ok else "-")


class RankTable:
    """A renderable choosing its columns for the width it gets (module docstring).
    ``last`` makes the last-line cell; ``caption`` goes under the table."""

    def __init__(
        self,
        ranks: Sequence[RankState],
        columns: Sequence[Column],
        last: Cell | None = None,
        caption: str | None = None,
    ) -> None:
        self.ranks, self.columns, self.last, self.caption = (
            list(ranks),
            list(columns),
            last,
            caption,
        )

    def _widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        widths = []
        for col in self.columns:
            cells = [console.measure(col.cell(r), options=options).maximum for r in self.ranks]
            widths.append(max([len(col.header), *cells]))
        return widths

    def pick(self, console: Console, options: ConsoleOptions) -> tuple[list[int], int]:
        """Indices of the columns that fit ``options.max_width``, and the cells left
        for the last line (0: not shown)."""
        widths = self._widths(console, options)
        order = sorted(range(len(self.columns)), key=lambda i: (self.columns[i].priority, i))
        chosen: list[int] = []
        used = 0
        for i in order:
            need = widths[i] + (GAP if chosen else 0)
            if self.columns[i].priority == 0 or used + need <= options.max_width:
                chosen.append(i)
                used += need
        room = options.max_width - used - GAP
        return sorted(chosen), room if self.last is not None and room >= MIN_LAST_LINE else 0

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
