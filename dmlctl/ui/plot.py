"""``dmlctl plot RUN``: a PNG of a run's loss, samples/s and communication share over
time, one line per rank, from its ``metrics.jsonl``; and :func:`draw`, the panels
(:class:`Lines`, :class:`Bars`, :class:`Samples`) of the benches' ``--plot FILE``.

matplotlib is an optional extra (``pip install 'dmlctl[plot]'``); without it
:func:`plot_run` raises a one-line UsageError (exit 2) saying so. It draws with the
Agg backend (no display needed).
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlctl.errors import UsageError
from dmlctl.runs.state import Replacement

PANELS = (("loss", "loss"), ("samples_per_s", "samples/s"), ("comm_share", "comm share"))


def require_matplotlib(what: str = "dmlctl plot") -> None:
    """UsageError (exit 2) when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"{what} needs matplotlib: pip install 'dmlctl[plot]'")


Series = dict[str, dict[int, list[tuple[float, float]]]]


def series(metrics: Path) -> Series:
    """key → rank → ``(seconds since the first record, value)`` for each panel's key;
    lines that are not records are skipped."""
    return timed_series(metrics)[0]


def timed_series(metrics: Path) -> tuple[Series, float]:
    """:func:`series`, and the time of the first record (0.0 without one)."""
    out: Series = {k: defaultdict(list) for k, _ in PANELS}
    start: float | None = None
    with open(metrics, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
                ts, rank, values = float(rec["ts"]), int(rec["rank"]), rec["values"]
            except (ValueError, KeyError, TypeError):
                continue
            start = ts if start is None else min(start, ts)
            for key, _ in PANELS:
                value = values.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[key][rank].append((ts, float(value)))
    for per_rank in out.values():
        for rank, points in per_rank.items():
            per_rank[rank] = [(t - (start or 0.0), v) for t, v in sorted(points)]
    return out, start or 0.0


def plot_run(
    run_dir: Path, out: Path, title: str, gaps: Sequence[Replacement] = (), world: int = 0
) -> int:
    """Write the PNG of ``run_dir``'s metrics to ``out``, each of ``gaps`` (a rank
    replaced in place, from its loss to its replacement's first record) shaded in
    every panel and, with gaps, a last panel of the ranks running of ``world`` over
    time; returns the number of points drawn. UsageError when matplotlib is missing
    or the run logged no metric."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = run_dir / "metrics.jsonl"
    data, start = timed_series(metrics) if metrics.is_file() else ({}, 0.0)
    points = sum(len(p) for per_rank in data.values() for p in per_rank.values())
    if not points:
        raise UsageError(f"run {run_dir.name} logged no loss, samples/s or comm share to plot")
    shown = len(PANELS) + (1 if gaps and world else 0)
    fig, axes = plt.subplots(shown, 1, figsize=(9, 8 * shown / len(PANELS)), sharex=True)
    for ax, (key, label) in zip(axes, PANELS, strict=False):
        _shade(ax, gaps, start, labelled=ax is axes[0])
        _panel(ax, data.get(key, {}), label)
    if shown > len(PANELS):
        end = max((t for per in data.values() for pts in per.values() for t, _ in pts), default=0)
        xs, ys = zip(*world_over_time(gaps, world, start, end), strict=True)
        axes[-1].step(xs, ys, where="post", color="tab:orange", linewidth=1.5)
        axes[-1].set_ylabel("ranks running")
        axes[-1].set_ylim(0, world + 0.5)
        axes[-1].grid(True, alpha=0.3)
    axes[-1].set_xlabel("seconds since the first record")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return points


def world_over_time(
    gaps: Sequence[Replacement], world: int, start: float, end: float
) -> list[tuple[float, int]]:
    """``(seconds since start, ranks running)`` at 0, at every loss and return of
    ``gaps`` (a gap still open runs to ``end``; a rank is down once while gaps of
    its overlap: a replacement lost before its first record), and at ``end``."""
    changes = sorted(
        [(gap.lost_at - start, 0, gap.rank) for gap in gaps]
        + [(gap.back_at - start, 1, gap.rank) for gap in gaps if gap.back_at is not None]
    )
    points, down = [(0.0, world)], set[int]()
    for at, back, rank in changes:
        (down.discard if back else down.add)(rank)
        points.append((at, world - len(down)))
    return [*points, (max(end, points[-1][0]), points[-1][1])]


def _shade(ax: Any, gaps: Sequence[Replacement], start: float, *, labelled: bool) -> None:
    """Each gap as a span from its loss to its replacement's first record (a line
    at the loss while it has none), labelled in the legend of one panel."""
    for gap in gaps:
        label = f"rank {gap.rank} replaced in place" if labelled else None
        if gap.back_at is None:
            ax.axvline(gap.lost_at - start, color="orange", linestyle="--", label=label)
        else:
            ax.axvspan(
                gap.lost_at - start, gap.back_at - start, color="orange", alpha=0.3, label=label
            )


def _panel(ax: Any, per_rank: dict[int, list[tuple[float, float]]], label: str) -> None:
    for rank in sorted(per_rank):
        xs, ys = zip(*per_rank[rank], strict=True)
        ax.plot(xs, ys, label=f"rank {rank}", linewidth=1)
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    if per_rank:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)


def _pyplot() -> Any:
    require_matplotlib("--plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


REF_STYLES = (("--", "dimgray"), (":", "black"), ("-.", "firebrick"))
"""Line style and colour of the first, second, third reference line of a panel."""


@dataclass(frozen=True)
class Lines:
    """One line per name (``(x, y)`` points, drawn in x order); ``refs`` are dashed
    horizontal lines (a goal, a baseline); ``colors`` fixes a name's colour (so one
    name reads the same in every panel)."""

    xlabel: str
    ylabel: str
    lines: Mapping[str, Sequence[tuple[float, float]]]
    log_x: bool = False
    refs: Mapping[str, float] = field(default_factory=dict)
    colors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Bars:
    """Grouped bars: one group per name in ``groups``, one bar per series of ``bars``
    (a value per group); ``refs`` are dashed horizontal lines. ``zoom`` fits the
    y axis to the values (for values close together, such as accuracies)."""

    ylabel: str
    groups: Sequence[str]
    bars: Mapping[str, Sequence[float]]
    refs: Mapping[str, float] = field(default_factory=dict)
    zoom: bool = False


@dataclass(frozen=True)
class Samples:
    """Every repeat of a measurement (a positive quantity: the axis starts at 0), one
    column of points per group, with a bar at the median; ``refs`` are dashed
    horizontal lines."""

    ylabel: str
    groups: Mapping[str, Sequence[float]]
    refs: Mapping[str, float] = field(default_factory=dict)


Panel = Lines | Bars | Samples


def draw(out: Path, title: str, panels: Sequence[Panel]) -> None:
    """Write a PNG to ``out``: ``panels`` stacked, under ``title``. For the benches'
    ``--plot FILE``; UsageError (exit 2) when matplotlib is missing."""
    plt = _pyplot()
    widest = max((len(p.groups) for p in panels if not isinstance(p, Lines)), default=0)
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(max(9, widest * 0.9), 4.5 * len(panels)), squeeze=False
    )  # 4.5 inches a panel
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        if isinstance(panel, Lines):
            _lines(ax, panel)
        elif isinstance(panel, Bars):
            _bars(ax, panel)
        else:
            _samples(ax, panel)
        for (name, value), style in zip(panel.refs.items(), REF_STYLES * 4, strict=False):
            ax.axhline(value, linestyle=style[0], linewidth=1.2, color=style[1], label=name)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    fig.suptitle(title)
    height = 4.5 * len(panels)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / height))  # room for the title
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _lines(ax: Any, panel: Lines) -> None:
    for name, points in panel.lines.items():
        xs, ys = zip(*sorted(points), strict=True) if points else ((), ())
        ax.plot(xs, ys, marker="o", markersize=3, label=name, color=panel.colors.get(name))
    if panel.log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)


def _bars(ax: Any, panel: Bars) -> None:
    n = len(panel.bars)
    width = 0.8 / max(n, 1)
    for i, (name, values) in enumerate(panel.bars.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(panel.groups))]
        ax.bar(xs, values, width=width, label=name)
    if panel.zoom:
        values = [v for vs in panel.bars.values() for v in vs] + list(panel.refs.values())
        low, high = min(values, default=0.0), max(values, default=1.0)
        pad = max((high - low) * 0.5, 0.01)
        ax.set_ylim(max(0.0, low - pad), high + pad)
    ax.set_xticks(range(len(panel.groups)), panel.groups, rotation=30, ha="right")
    ax.set_ylabel(panel.ylabel)


def _samples(ax: Any, panel: Samples) -> None:
    for g, values in enumerate(panel.groups.values()):
        if not values:
            continue
        ax.scatter([g] * len(values), values, s=18, alpha=0.7, color="C0")
        ax.hlines(statistics.median(values), g - 0.25, g + 0.25, color="C1", linewidth=2)
    ax.set_xticks(range(len(panel.groups)), list(panel.groups), rotation=30, ha="right")
    ax.set_xlim(-0.6, len(panel.groups) - 0.4)
    top = max(
        [v for vs in panel.groups.values() for v in vs] + list(panel.refs.values()), default=1
    )
    ax.set_ylim(0, top * 1.08 if top > 0 else 1)
    ax.set_ylabel(panel.ylabel + " (bar: median)")
