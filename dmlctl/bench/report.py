"""Results of the communication benchmark: parsing, bus bandwidth, rendering (pure).

Conventions follow nccl-tests (``doc/PERFORMANCE.md`` there):

* ``bytes`` is the size column: the bytes each rank sends for ``allreduce`` and
  ``broadcast``, and the *total gathered* bytes (``n`` times the per-rank chunk) for
  ``allgather``. ``count`` is the number of elements each rank passes to one call
  (for ``allgather``: elements per rank).
* ``algbw = bytes / time`` in GB/s (1 GB = 10⁹ bytes);
  ``busbw = algbw * bus_factor(op, n)`` — the number to compare with the hardware's
  link bandwidth, independent of the number of ranks.

Nothing here imports torch or does I/O, so the CLI can use it freely and the
worker script (``comm_worker.py``) shares the same definitions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from dmlctl.errors import UsageError

OPS: tuple[str, ...] = ("allreduce", "allgather", "broadcast")
"""Collectives the benchmark knows, in the order they are reported."""

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``"1024"``, ``"4K"``, ``"16M"``, ``"1G"``, ``"16MiB"``, ``"4kb"``.

    Units are binary (K = 1024). Raises :class:`UsageError` for anything else,
    including zero.
    """
    match = _SIZE.match(text)
    if match is None:
        raise UsageError(f"not a size: {text!r} (expected e.g. 1024, 64K, 16M, 1G)")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0:
        raise UsageError(f"size must be positive, got {text!r}")
    return value


def human_size(nbytes: int) -> str:
    """``1024 → "1 KiB"``, ``1536 → "1.5 KiB"``, ``512 → "512 B"`` (binary units)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}" if unit == "B" else f"{value:.4g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks (nccl-tests).

    allreduce ``2(n-1)/n``, allgather ``(n-1)/n``, broadcast ``1``. Raises
    :class:`UsageError` for an unknown op or ``n < 1``.
    """
    if n < 1:
        raise UsageError(f"world size must be at least 1, got {n}")
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op == "allgather":
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise UsageError(f"unknown op {op!r}; valid: {', '.join(OPS)}")


def parse_ops(text: str) -> tuple[str, ...]:
    """``"allreduce,broadcast"`` → ``("allreduce", "broadcast")``; unknown names → UsageError.

    Order and duplicates are normalised to :data:`OPS` order.
    """
    names = {part.strip().lower() for part in text.split(",") if part.strip()}
    unknown = sorted(names - set(OPS))
    if unknown or not names:
        raise UsageError(
            f"unknown op(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(OPS)}"
        )
    return tuple(op for op in OPS if op in names)


def size_sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """``min_bytes, min_bytes·factor, …`` up to and including ``max_bytes`` (nccl-tests ``-f``).

    Raises :class:`UsageError` unless ``0 < min_bytes <= max_bytes`` and ``factor >= 2``.
    """
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise UsageError(f"need 0 < min-bytes <= max-bytes, got {min_bytes} and {max_bytes}")
    if factor < 2:
        raise UsageError(f"factor must be at least 2, got {factor}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


DEFAULT_FACTOR = 4
"""How much larger each size of a sweep is than the one before, by default."""


@dataclass(frozen=True)
class Sweep:
    """What the ``comm`` and ``ps`` benches measure: every size from ``min_bytes`` to
    ``max_bytes`` (:func:`size_sweep`), ``warmup`` untimed then ``iters`` timed calls
    each. Only a valid sweep is made: :class:`UsageError` for a bad size range,
    ``iters < 1`` or ``warmup < 0``."""

    min_bytes: int
    max_bytes: int
    iters: int
    warmup: int
    factor: int = DEFAULT_FACTOR

    @classmethod
    def parse(cls, min_bytes: str, max_bytes: str, iters: int, warmup: int) -> Sweep:
        """The sweep of a bench's ``--min-bytes``/``--max-bytes`` texts (:func:`parse_size`)
        and ``--iters``/``--warmup``; :class:`UsageError` for any bad one."""
        return cls(parse_size(min_bytes), parse_size(max_bytes), iters, warmup)

    def __post_init__(self) -> None:
        size_sweep(self.min_bytes, self.max_bytes, self.factor)
        if self.iters < 1 or self.warmup < 0:
            raise UsageError(
                f"need --iters >= 1 and --warmup >= 0, got {self.iters} and {self.warmup}"
            )

    @property
    def sizes(self) -> list[int]:
        """The sizes measured, smallest first."""
        return size_sweep(self.min_bytes, self.max_bytes, self.factor)

    def bytes_moved(self) -> int:
        """Bytes one rank sends over the whole sweep in one kind of call (warm-up included)."""
        return sum(self.sizes) * (self.iters + self.warmup)

    def args(self) -> list[str]:
        """The worker script's options for this sweep (``--min-bytes`` … ``--warmup``)."""
        return [
            *("--min-bytes", str(self.min_bytes), "--max-bytes", str(self.max_bytes)),
            *("--factor", str(self.factor), "--iters", str(self.iters)),
            *("--warmup", str(self.warmup)),
        ]


@dataclass(frozen=True)
class CommResult:
    """One (op, size) measurement: the slowest rank's average time per call."""

    op: str
    bytes: int
    count: int
    dtype: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


def _result(values: dict[str, Any]) -> CommResult | None:
    try:
        result = CommResult(
            op=str(values["op"]),
            bytes=int(values["bytes"]),
            count=int(values["count"]),
            dtype=str(values.get("dtype", "float32")),
            time_us=float(values["time_us"]),
            algbw_gbps=float(values["algbw_gbps"]),
            busbw_gbps=float(values["busbw_gbps"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return result if result.op in OPS else None


def metric_values(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The value objects in ``metrics.jsonl`` lines (or a worker's printed JSON lines):
    the ``values`` of ``{"values": {...}}`` records, or the bare ``{...}`` object.
    Blank, non-JSON and torn lines, and anything not an object, are skipped."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        values = record.get("values", record) if isinstance(record, dict) else None
        if isinstance(values, dict):
            yield values


def parse_metrics(lines: Iterable[str]) -> list[CommResult]:
    """Benchmark results from ``metrics.jsonl`` lines (or the worker's printed JSON lines).

    Accepts records shaped ``{"values": {...}}`` and bare ``{...}`` value objects.
    Lines that are blank, not JSON, or not a complete benchmark record (e.g. other
    metrics, a torn last line) are skipped. Results are sorted by op (in
    :data:`OPS` order) then size; for a repeated (op, bytes) the last one wins.
    """
    found: dict[tuple[str, int], CommResult] = {}
    for values in metric_values(lines):
        if (result := _result(values)) is not None:
            found[(result.op, result.bytes)] = result
    return sorted(found.values(), key=lambda r: (OPS.index(r.op), r.bytes))


def _by_op(results: Sequence[CommResult]) -> dict[str, list[CommResult]]:
    grouped: dict[str, list[CommResult]] = {}
    for r in results:
        grouped.setdefault(r.op, []).append(r)
    return grouped


def render_comm_table(results: Sequence[CommResult], world_size: int) -> Table:
    """nccl-tests style table: one block per op, one row per size, op name as block title."""
    table = Table(
        title=f"communication benchmark, {world_size} ranks",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for name in ("size", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        table.add_column(name, justify="left" if name == "type" else "right")
    grouped = _by_op(results)
    for index, (op, rows) in enumerate(grouped.items()):
        table.add_row(f"[bold]{op}[/bold]", end_section=False)
        for i, r in enumerate(rows):
            table.add_row(
                human_size(r.bytes),
                str(r.count),
                r.dtype,
                f"{r.time_us:.1f}",
                f"{r.algbw_gbps:.3f}",
                f"{r.busbw_gbps:.3f}",
                end_section=i == len(rows) - 1 and index < len(grouped) - 1,
            )
    return table


def comm_json(results: Sequence[CommResult], world_size: int) -> dict[str, Any]:
    """Machine-readable results: ``{"world_size", "results": [CommResult fields...],
    "avg_busbw_gbps": {op: mean busbw}}`` (the last one as nccl-tests' "Avg bus bandwidth")."""
    grouped = _by_op(results)
    return {
        "world_size": world_size,
        "results": [asdict(r) for r in results],
        "avg_busbw_gbps": {
            op: sum(r.busbw_gbps for r in rows) / len(rows) for op, rows in grouped.items()
        },
    }
