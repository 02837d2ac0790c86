"""Small wording helpers shared by every message dmlctl prints."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun`` agreeing: ``1 host``, ``2 hosts``, ``0 hosts``;
    ``many`` is the plural of an irregular noun (default ``noun + "s"``)."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"
