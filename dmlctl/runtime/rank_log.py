"""What ``ctx.log`` records for a rank (:class:`RankLog`): the caller's metrics, merged
over the sources strategies and the session add (the caller's values win), plus the
run's ``epoch`` and ``progress`` for the controller; written by the rank's
:class:`~dmlctl.runtime.metrics.MetricLogger`, whose divergence check
(:func:`divergence_check`) runs on every converted record."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dmlctl.runtime import divergence
from dmlctl.runtime.cursor import DataCursor
from dmlctl.runtime.metrics import MetricLogger, Scalar
from dmlctl.runtime.progress import TRACKER

Check = Callable[[int, Mapping[str, Scalar]], None]


def divergence_check(strategy: str, advice: Callable[[], str]) -> Check:
    """The guard a :class:`MetricLogger` runs on each record: a non-finite loss raises
    :class:`~dmlctl.runtime.divergence.Diverged` naming ``strategy``, the step and
    ``advice()`` (asked only then)."""

    def check(step: int, values: Mapping[str, Scalar]) -> None:
        divergence.check_logged(values, strategy=strategy, step=step, advice=advice)

    return check


class RankLog:
    """One rank's metric records (see the module docstring). ``progress`` False (a
    plain ``python train.py``): the printed line stays as the caller wrote it."""

    def __init__(self, metrics: MetricLogger, cursor: DataCursor, *, progress: bool) -> None:
        self._metrics, self._cursor, self._with_progress = metrics, cursor, progress
        self._sources: list[Callable[[], dict[str, float]]] = []

    @property
    def sources(self) -> tuple[Callable[[], dict[str, float]], ...]:
        """The sources merged into every record, in the order they were added."""
        return tuple(self._sources)

    def add_source(self, source: Callable[[], dict[str, float]]) -> None:
        """Merge ``source()`` into every record."""
        self._sources.append(source)

    def log(self, step: int | None, metrics: dict[str, Any], total_steps: int | None) -> int:
        """Write one record at ``step`` (None: the previous + 1); the step used."""
        for source in self._sources:
            metrics = {**source(), **metrics}
        if self._with_progress:
            at = step if step is not None else self._metrics.next_step
            extra = self._cursor.progress(total_steps, at)
            metrics = {**metrics, **{k: v for k, v in extra.items() if k not in metrics}}
        TRACKER.step()
        return self._metrics.log(step, metrics)
