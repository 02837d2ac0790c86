"""The tables of ``dmlctl bench strategies`` (one per section of its report)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table


def render_strategies_table(report: Mapping[str, Any]) -> list[Table]:
    """A table per section the report holds: throughput, bytes, filters, overlap."""
    tables: list[Table] = []
    if "throughput_ratio" in report:
        tables.append(_throughput(report))
    if "bytes" in report:
        tables.append(_bytes("bytes per step relative to ssgd (large matrices)", report["bytes"]))
    if "filters" in report:
        title = "model and push filters: bytes per step relative to the same strategy without"
        tables.append(_bytes(title, report["filters"]))
    if "overlap" in report:
        tables.append(_overlap(report))
    return tables


def _table(title: str, columns: tuple[str, ...], left: tuple[str, ...]) -> Table:
    """An empty table: ``columns``, those in ``left`` left-justified, the rest right."""
    t = Table(title=title, title_justify="left", show_edge=False)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right")
    return t


def _throughput(report: Mapping[str, Any]) -> Table:
    t = _table(
        f"ssgd throughput, {report['workers']} workers, {report['repeats']} runs "
        "each (samples/s per rank)",
        ("side", "median", "min", "max"),
        ("side",),
    )
    for side in ("dmlctl", "bare"):
        s = report[f"{side}_samples_per_s"]
        t.add_row(side, f"{s['median']:.0f}", f"{s['min']:.0f}", f"{s['max']:.0f}")
    t.add_row(
        "[bold]dmlctl/bare[/bold]",
        f"[bold]{report['throughput_ratio']:.3f}[/bold]",
        "",
        f"goal ≥ {report['throughput_goal']}",
    )
    return t


def _bytes(title: str, rows: Mapping[str, Mapping[str, Any]]) -> Table:
    """Bytes per step, the ratio to each row's baseline, the goal (a column only when
    some row has one) and samples/s."""
    goals = any(row.get("goal") is not None for row in rows.values())
    columns = ("strategy", "bytes/step", "ratio", "against", *(("goal",) if goals else ()))
    b = _table(title, (*columns, "samples/s"), ("strategy", "against"))
    for name, row in rows.items():
        goal = "" if row.get("goal") is None else f"≤ {row['goal']:.3f}"
        rate = row.get("samples_per_s")
        shown = f"{rate:.0f}" if isinstance(rate, int | float) else ""
        ratio = f"{row['ratio']:.4f}" if "ratio" in row else ""
        against = row.get("against") or ""
        if "bytes_per_step" in row:
            cells = [f"{row['bytes_per_step']:,.0f}", ratio, against]
        else:
            cells, shown = [row.get("status", "-"), "", against], ""
        b.add_row(name, *cells, *((goal,) if goals else ()), shown)
    return b


def _overlap(report: Mapping[str, Any]) -> Table:
    t = _table(
        f"overlap of communication and computation, {report['repeats']} runs each "
        "(samples/s per worker, medians)",
        ("strategy", "samples/s off", "samples/s on", "ratio", "comm % off", "comm % on"),
        ("strategy",),
    )
    for name, row in report["overlap"].items():
        off, on = row["false"], row["true"]
        t.add_row(
            name,
            f"{off['samples_per_s']['median']:.0f}",
            f"{on['samples_per_s']['median']:.0f}",
            f"[bold]{row['ratio']:.3f}[/bold]",
            f"{100 * off['comm_share']['median']:.0f}",
            f"{100 * on['comm_share']['median']:.0f}",
        )
    return t
