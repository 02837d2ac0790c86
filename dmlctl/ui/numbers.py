"""Compact numbers for narrow cells: one formatter per kind of quantity.

Every view (rank table, plain lines, strategy columns) formats a rate or a byte count
through these, so a value reads the same everywhere. Pure; ``-`` for a missing value.
"""

from __future__ import annotations

MISSING = "-"  # as dmlctl.ui.format.MISSING: a value not known


def compact_rate(value: float | None) -> str:
    """``950.3``, ``12.3k``, ``4.1M`` (per second), or ``-``; at most 6 characters
    below a billion."""
    if value is None:
        return MISSING
    for limit, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{unit}"
    return f"{value:.1f}"


def compact_bytes(value: object) -> str:
    """``512 B``, ``3.4 KiB``, ``3.4 MiB``, ``1.2 GiB`` (binary units; GiB is the
    largest); ``-`` for anything that is not a number (a bool included)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return MISSING
    size = float(value)
    for unit in ("B", "KiB", "MiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
