"""The rank table's strategy columns: what strategies report through ``ctx.log``.

A column appears when any rank reported its key (:func:`strategy_columns`). ``comm/step``
and ``comm %`` show the run's average, from the rank's cumulative totals
(:meth:`dmlctl.runs.state.RankState.comm_run`), with the recent window's value beside
it: ``4.9 KiB (19.5)``, ``15% (62)``. A squeezed column drops the recent value rather
than cut it; a rank whose records carry no totals (an older dmlctl) shows the window.

Pure: values in, rich renderables out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.text import Text

from dmlctl.runs.comm import CommTotals
from dmlctl.runs.state import RankState
from dmlctl.ui.numbers import compact_bytes, compact_rate

MISSING = "-"  # as dmlctl.ui.format.MISSING: a value not known

MetricCell = Callable[[RankState], RenderableType]

_VALUE = re.compile(r"^([-+0-9.,e]+)\s*(.*)$")


def _share(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return MISSING
    return f"{100 * float(value):.0f}%"


def _number(value: object) -> str:
    """A count as the integer it is (``1013``, never ``1.01e+03``), another number to
    3 significant digits."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return MISSING
    if float(value).is_integer() and abs(value) < 1e12:
        return str(int(value))
    return f"{float(value):.3g}"


def with_recent(average: str, recent: str) -> str:
    """``average`` with the recent window's value beside it in parentheses, its unit
    dropped when both share it (``4.9 KiB (19.5)``, ``15% (62)``, ``4.9 KiB (1.2
    MiB)``); just ``average`` when the two read the same or the recent one is unknown."""
    if recent in (average, MISSING):
        return average
    avg, now = _VALUE.match(average), _VALUE.match(recent)
    if avg and now and avg.group(2) == now.group(2):
        recent = now.group(1)
    return f"{average} ({recent})"


@dataclass(frozen=True)
class AverageCell:
    """``average (recent)`` where the column is wide enough for it, else ``average``
    alone (cut with ``…`` only when even that does not fit). ``str()`` is the full
    text."""

    average: str
    recent: str

    def __str__(self) -> str:
        return with_recent(self.average, self.recent)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(len(self.average), len(str(self))).with_maximum(options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        full = str(self)
        shown = full if len(full) <= options.max_width else self.average
        yield Text(shown, no_wrap=True, overflow="ellipsis")


def _run_average(
    key: str, average: Callable[[CommTotals], float | None], fmt: Callable[[object], str]
) -> MetricCell:
    """A cell of the run's average (from the rank's totals) with metric ``key``, the
    recent window, beside it; the window alone when no record carried totals."""

    def cell(rank: RankState) -> RenderableType:
        totals = rank.comm_run()
        recent = fmt(rank.metrics.get(key))
        value = None if totals is None else average(totals)
        return Text(recent) if value is None else AverageCell(fmt(value), recent)

    return cell


def _pair(first: str, second: str, fmt: Callable[[object], str]) -> MetricCell:
    """A cell ``a/b`` of two metrics (``-`` for a missing one)."""
    return lambda r: Text(f"{fmt(r.metrics.get(first))}/{fmt(r.metrics.get(second))}")


def _rate(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return MISSING
    return compact_rate(float(value))


def _count(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return MISSING
    return str(round(value))


def _one(key: str, fmt: Callable[[object], str]) -> MetricCell:
    return lambda r: Text(fmt(r.metrics.get(key)))


class MetricColumn(NamedTuple):
    """A strategy column: its header, its cell, and its meaning in a few words (the
    dashboard's legend line, ``dmlctl strategies NAME``)."""

    header: str
    cell: MetricCell
    meaning: str


#: Metric key → its column, in column order.
STRATEGY_COLUMNS: dict[str, MetricColumn] = {
    # a GPU worker's memory: allocated by tensors / reserved by PyTorch's allocator
    "gpu_mem_bytes": MetricColumn(
        "GPU mem",
        _pair("gpu_mem_bytes", "gpu_reserved_bytes", compact_bytes),
        "allocated/reserved by PyTorch on the worker's GPU",
    ),
    "comm_bytes_per_step": MetricColumn(
        "comm/step",
        _run_average("comm_bytes_per_step", CommTotals.bytes_per_step, compact_bytes),
        "bytes sent per step, run average (recent window)",
    ),
    "comm_share": MetricColumn(
        "comm %",
        _run_average("comm_share", CommTotals.share, _share),
        "share of time communicating, run average (recent window)",
    ),
    "consensus": MetricColumn(
        "consensus",
        _one("consensus", _number),
        "how far apart the replicas are (rms distance to their mean)",
    ),
    "primal_res": MetricColumn(
        "primal res", _one("primal_res", _number), "admm's primal residual ‖r‖"
    ),
    "dual_res": MetricColumn("dual res", _one("dual_res", _number), "admm's dual residual ‖s‖"),
    # parameter servers: workers report their clock, servers the rest
    "clock": MetricColumn("clock", _one("clock", _count), "steps this worker has pushed"),
    "staleness_max": MetricColumn(
        "stale med/max",
        _pair("staleness_median", "staleness_max", _number),
        "versions behind, median/max, of the updates a server applied",
    ),
    "push_per_s": MetricColumn(
        "push/pull per s",
        _pair("push_per_s", "pull_per_s", _rate),
        "pushes/pulls a server answers per second",
    ),
    "push_bytes_per_s": MetricColumn(
        "in/out per s",
        _pair("push_bytes_per_s", "pull_bytes_per_s", compact_bytes),
        "bytes a server receives/sends per second",
    ),
    "clock_spread": MetricColumn(
        "spread", _one("clock_spread", _number), "fastest minus slowest worker's clock"
    ),
    # round servers: sync-ps servers' dropped gradients, aadmm servers' delays
    # (updates of z a worker missed: now / largest ever)
    "dropped": MetricColumn(
        "dropped",
        _one("dropped", _count),
        "late gradients a sync-ps server left out of its rounds",
    ),
    "delay_max": MetricColumn(
        "delay now/max",
        _pair("delay_now", "delay_max", _count),
        "updates of z a worker missed, now/largest (aadmm)",
    ),
}


COMMON = frozenset({"gpu_mem_bytes", "comm_bytes_per_step", "comm_share"})
"""Columns every strategy (or every GPU run) has; the others are a strategy's own,
which a narrow terminal keeps first (after the role, where servers have rows)."""


def strategy_columns(ranks: Sequence[RankState]) -> list[str]:
    """The strategy metrics any rank reported, in column order (none: no columns)."""
    seen = {key for r in ranks for key in r.metrics}
    return [key for key in STRATEGY_COLUMNS if key in seen]
