"""``dmlctl plot RUN``: a PNG of a run's loss, samples/s and communication share over
time, one line per rank, from its ``metrics.jsonl``.

matplotlib is an optional extra (``pip install 'dmlctl[plot]'``); without it
:func:`plot_run` raises a one-line UsageError (exit 2) saying so. It draws with the
Agg backend (no display needed).
"""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from dmlctl.errors import UsageError

PANELS = (("loss", "loss"), ("samples_per_s", "samples/s"), ("comm_share", "comm share"))


def require_matplotlib(what: str = "dmlctl plot") -> None:
    """UsageError (exit 2) when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"{what} needs matplotlib: pip install 'dmlctl[plot]'")


def series(metrics: Path) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """key → rank → ``(seconds since the first record, value)`` for each panel's key;
    lines that are not records are skipped."""
    out: dict[str, dict[int, list[tuple[float, float]]]] = {k: defaultdict(list) for k, _ in PANELS}
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
    return out


def plot_run(run_dir: Path, out: Path, title: str) -> int:
    """Write the PNG of ``run_dir``'s metrics to ``out``; returns the number of points
    drawn. UsageError when matplotlib is missing or the run logged no metric."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = run_dir / "metrics.jsonl"
    data = series(metrics) if metrics.is_file() else {}
    points = sum(len(p) for per_rank in data.values() for p in per_rank.values())
    if not points:
        raise UsageError(f"run {run_dir.name} logged no loss, samples/s or comm share to plot")
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 8), sharex=True)
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        _panel(ax, data.get(key, {}), label)
    axes[-1].set_xlabel("seconds since the first record")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return points


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


def plot_lines(
    out: Path,
    title: str,
    axes: tuple[str, str],
    lines: dict[str, list[tuple[float, float]]],
    *,
    log_x: bool = False,
) -> None:
    """One line per name of ``lines`` (``(x, y)`` points); ``axes`` are the x and y
    labels. For the benches' ``--plot FILE``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, points in lines.items():
        xs, ys = zip(*sorted(points), strict=True) if points else ((), ())
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(axes[0])
    ax.set_ylabel(axes[1])
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_bars(
    out: Path,
    title: str,
    ylabel: str,
    groups: list[str],
    bars: dict[str, list[float]],
    references: dict[str, float] | None = None,
) -> None:
    """Grouped bars: one group per name in ``groups``, one bar per series of
    ``bars`` (a value per group); ``references`` are drawn as dashed lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, len(groups) * 0.8), 5))
    width = 0.8 / max(len(bars), 1)
    for i, (name, values) in enumerate(bars.items()):
        xs = [g + (i - (len(bars) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width=width, label=name)
    for name, value in (references or {}).items():
        ax.axhline(value, linestyle="--", linewidth=1, color="gray", label=name)
    values = [v for series in bars.values() for v in series] + list((references or {}).values())
    low, high = min(values, default=0.0), max(values, default=1.0)
    pad = max((high - low) * 0.5, 0.01)
    ax.set_ylim(max(0.0, low - pad), high + pad)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small", ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
