"""Results of the parameter-server benchmark: definitions, parsing, rendering (pure).

Definitions (shared with the rank script ``ps_worker.py``, which builds its records
with :func:`ps_result`):

* ``bytes`` — the gradient size ``B``: ``count`` float32 elements, split over the
  servers' shards. Every worker pushes all ``B`` bytes and pulls all ``B`` bytes back
  in one *round*.
* ``ps_round_us`` — the time of one round (``push`` of every shard, then ``pull`` of
  every shard, each call returning once its messages completed), all workers running
  rounds concurrently: each worker's median over the timed rounds, then the slowest
  worker's median.
* ``ps_bytes_per_s = bytes / round time`` — bytes of gradient one worker gets
  aggregated on the servers *and back* per second. The wire carries ``2·B`` per worker
  per round (``B`` up, ``B`` down) and ``2·W·B`` through the servers.
* ``allreduce_us`` — one ``all_reduce`` (sum) of the same ``B`` bytes on all
  ``W + S`` ranks of the same run: each rank's median over the timed calls, then the
  slowest rank's median. ``allreduce_bytes_per_s = bytes / that time`` (nccl-tests'
  *algbw*).
* ``ratio = ps_bytes_per_s / allreduce_bytes_per_s`` (= allreduce time / round
  time). :data:`GOAL`: at least 0.5 at the largest size.

Nothing here imports torch or does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from dmlctl.bench.report import human_size, metric_values

GOAL = 0.5
"""The ratio the parameter-server transport should reach at the largest size."""

BENCH = "ps"
"""Value of the ``bench`` key that marks a result record in ``metrics.jsonl``."""


@dataclass(frozen=True)
class PsResult:
    """One size of the sweep: the round and all-reduce times and what follows from
    them (see the module docstring for each definition)."""

    bytes: int
    count: int
    workers: int
    servers: int
    ps_round_us: float
    allreduce_us: float
    ps_bytes_per_s: float
    allreduce_bytes_per_s: float
    ratio: float


def ps_result(
    nbytes: int, *, workers: int, servers: int, round_s: float, allreduce_s: float
) -> PsResult:
    """The result for ``nbytes`` (float32) from the two measured times in seconds.

    Raises :class:`ValueError` unless both times are positive and finite and
    ``nbytes`` is a positive multiple of 4.
    """
    if nbytes <= 0 or nbytes % 4:
        raise ValueError(f"bytes must be a positive multiple of 4, got {nbytes}")
    for name, value in (("round", round_s), ("allreduce", allreduce_s)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} time must be positive and finite, got {value}")
    ps_rate, ar_rate = nbytes / round_s, nbytes / allreduce_s
    return PsResult(
        bytes=nbytes,
        count=nbytes // 4,
        workers=workers,
        servers=servers,
        ps_round_us=round_s * 1e6,
        allreduce_us=allreduce_s * 1e6,
        ps_bytes_per_s=ps_rate,
        allreduce_bytes_per_s=ar_rate,
        ratio=ps_rate / ar_rate,
    )


def record_values(result: PsResult) -> dict[str, Any]:
    """The values rank 0 logs for ``result`` (parsed back by :func:`parse_ps_metrics`)."""
    return {"bench": BENCH, **asdict(result)}


def _result(values: dict[str, Any]) -> PsResult | None:
    if values.get("bench") != BENCH:
        return None
    try:
        return PsResult(
            bytes=int(values["bytes"]),
            count=int(values["count"]),
            workers=int(values["workers"]),
            servers=int(values["servers"]),
            ps_round_us=float(values["ps_round_us"]),
            allreduce_us=float(values["allreduce_us"]),
            ps_bytes_per_s=float(values["ps_bytes_per_s"]),
            allreduce_bytes_per_s=float(values["allreduce_bytes_per_s"]),
            ratio=float(values["ratio"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def parse_ps_metrics(lines: Iterable[str]) -> list[PsResult]:
    """Benchmark results from ``metrics.jsonl`` lines, sorted by size.

    Accepts records shaped ``{"values": {...}}`` and bare value objects; only those
    with ``"bench": "ps"`` and every :class:`PsResult` field count (other ranks'
    per-rank records, blank, torn or foreign lines are skipped). For a repeated size
    the last record wins.
    """
    found: dict[int, PsResult] = {}
    for values in metric_values(lines):
        if (result := _result(values)) is not None:
            found[result.bytes] = result
    return [found[size] for size in sorted(found)]


def _mb(rate: float) -> str:
    return f"{rate / 1e6:.1f}"


def largest_ratio(results: Sequence[PsResult]) -> float | None:
    """The ratio at the largest size (None without results)."""
    return max(results, key=lambda r: r.bytes).ratio if results else None


def ps_summary(results: Sequence[PsResult]) -> str:
    """One line: ``ratio at the largest size: 0.62 (goal ≥ 0.5)``."""
    ratio = largest_ratio(results)
    shown = "n/a" if ratio is None else f"{ratio:.2f}"
    return f"ratio at the largest size: {shown} (goal ≥ {GOAL:g})"


def render_ps_table(results: Sequence[PsResult], workers: int, servers: int) -> Table:
    """One row per size: bytes, PS push+pull MB/s, allreduce MB/s (1 MB = 10⁶ B), ratio."""
    table = Table(
        title=f"parameter-server benchmark, {workers} workers + {servers} servers",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for name in (
        "size",
        "round (us)",
        "PS push+pull (MB/s)",
        "allreduce (us)",
        "allreduce (MB/s)",
        "ratio",
    ):
        table.add_column(name, justify="right")
    for r in results:
        table.add_row(
            human_size(r.bytes),
            f"{r.ps_round_us:.1f}",
            _mb(r.ps_bytes_per_s),
            f"{r.allreduce_us:.1f}",
            _mb(r.allreduce_bytes_per_s),
            f"{r.ratio:.2f}",
        )
    return table


def ps_json(results: Sequence[PsResult], workers: int, servers: int) -> dict[str, Any]:
    """Machine-readable results: ``{"workers", "servers", "goal", "results": [PsResult
    fields...], "ratio_at_largest"}`` (``ratio_at_largest`` is null without results)."""
    return {
        "workers": workers,
        "servers": servers,
        "goal": GOAL,
        "results": [asdict(r) for r in results],
        "ratio_at_largest": largest_ratio(results),
    }
