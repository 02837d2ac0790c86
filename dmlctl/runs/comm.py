"""A rank's communication totals, from which the run's averages are exact.

A strategy's meter (``dmlctl.runtime.optimizer.CommMeter``) adds to each metric record
the window values ``comm_bytes_per_step`` and ``comm_share`` and the cumulative
:data:`dmlctl.protocol.COMM_TOTALS` of its rank process. The reducer keeps the newest
totals of each process, so the averages below are exact however many records were
missed in between; records of an older dmlctl carry no totals (:meth:`CommTotals.from_values`
returns None) and the views fall back to the window values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dmlctl.protocol import COMM_TOTALS


@dataclass(frozen=True)
class CommTotals:
    """What a rank counted since its meter started (or over several processes, added):
    bytes it sent, seconds it spent communicating, optimizer steps, wall seconds."""

    sent_bytes: float = 0.0
    comm_seconds: float = 0.0
    steps: float = 0.0
    wall_seconds: float = 0.0

    @staticmethod
    def from_values(values: Mapping[str, object]) -> CommTotals | None:
        """The totals a metric record's values carry, or None unless all four are
        numbers (a record of an older dmlctl, or one without a training step)."""
        found = [values.get(key) for key in COMM_TOTALS]
        numbers = [
            float(v) for v in found if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        if len(numbers) != len(COMM_TOTALS):
            return None
        return CommTotals(*numbers)

    @staticmethod
    def from_dict(data: Mapping[str, Any] | None) -> CommTotals | None:
        """Inverse of :func:`dataclasses.asdict` (None stays None)."""
        return None if data is None else CommTotals(**data)

    def __add__(self, other: CommTotals) -> CommTotals:
        return CommTotals(
            self.sent_bytes + other.sent_bytes,
            self.comm_seconds + other.comm_seconds,
            self.steps + other.steps,
            self.wall_seconds + other.wall_seconds,
        )

    def bytes_per_step(self) -> float | None:
        """Average bytes sent per optimizer step, or None before the first step."""
        return self.sent_bytes / self.steps if self.steps > 0 else None

    def share(self) -> float | None:
        """Share of the wall time spent communicating (at most 1), or None before any
        wall time was counted."""
        return min(1.0, self.comm_seconds / self.wall_seconds) if self.wall_seconds > 0 else None


def added(first: CommTotals | None, second: CommTotals | None) -> CommTotals | None:
    """The sum of two totals, where None counts as nothing (None if both are)."""
    if first is None or second is None:
        return first or second
    return first + second
