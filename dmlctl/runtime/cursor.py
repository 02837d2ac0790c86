"""Where a rank is in its data (:class:`DataCursor`): the epoch, the batches of it
yielded, the batches a resume skips, the plan of ``ctx.shard`` (batches per epoch,
epochs) and the progress it gives, and what runs at the data's end. The part of
:class:`~dmlctl.runtime.context.Context` behind ``shard``, ``epoch``, ``finish`` and
``on_data_end``; a checkpoint saves and restores its position."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dmlctl.protocol import PROGRESS
from dmlctl.runtime import rejoin
from dmlctl.runtime.data import batches_per_epoch
from dmlctl.runtime.metrics import MetricLogger
from dmlctl.runtime.progress import TRACKER
from dmlctl.runtime.rejoin import Position


class DataCursor:
    """One rank's position in its data (see the module docstring)."""

    def __init__(self, metrics: MetricLogger, position: Position | None = None) -> None:
        self._metrics = metrics
        #: ``restart.mode: in_place``: the position is written as each batch is taken,
        #: and a worker started again in place starts where its predecessor was.
        self._position = position
        self.epoch = 0
        self.batches = 0  # yielded in this epoch
        self.skip = 0  # left to skip: consumed before the checkpoint a resume loaded
        self.resume_at: tuple[int, int] | None = None  # (epoch, batches consumed)
        self.taken = 0  # batches yielded in all, a replaced predecessor's included
        if position is not None and rejoin.rejoining() and (at := position.read()) is not None:
            self.resume_at, self.taken = (at[0], at[1]), at[2]
        self._taken_before = self.taken  # by a replaced predecessor
        self._advance = 0  # batches a replacement skips beyond that (go_on_at)
        self.plan: tuple[int, int] | None = None  # (batches per epoch, epochs) of shard()
        self._on_end: list[Callable[[], None]] = []
        self._ended = False  # the data ended (and no batch was taken since)

    def go_on_at(self, taken: int) -> None:
        """A replacement that joined its peers at their step ``taken`` (one batch a
        step): its data goes on there, the batches from its predecessor's position up
        to it skipped (their samples are not seen in this epoch) — or taken again
        from there, when the predecessor died in a step its peers then did again."""
        self._advance = taken - self.taken
        self.taken = self._taken_before = taken

    def started(self) -> bool:
        """Whether this process has taken a batch of its own, or reached the data's
        end (a replacement that joined its peers' last round has none left: from
        there on it takes part in their store collectives)."""
        return self.taken > self._taken_before or self._ended

    def begin(
        self, size: int, world: int, batch_size: int, epochs: int, drop_last: bool, start: int
    ) -> int:
        """A new iteration over ``size`` samples shared by ``world`` replicas: its plan,
        and the epoch it starts at — a resume's (whose batches consumed are then
        skipped) when that is not before ``start``."""
        self._metrics.start_clock()
        self.skip = 0
        if size > 0 and epochs > 0 and batch_size >= 1:
            per_epoch = batches_per_epoch(size, world, batch_size, drop_last)
            self.plan = (per_epoch, epochs) if per_epoch > 0 else None
        if self._advance:
            self.resume_at = self._advanced(self.resume_at or (start, 0))
        if self.resume_at is not None and self.resume_at[0] >= start:
            start, self.skip = self.resume_at
        self.resume_at = None
        return start

    def _advanced(self, at: tuple[int, int]) -> tuple[int, int]:
        """``at`` (epoch, batches) moved by the batches :meth:`go_on_at` skips (or
        takes again: back), never before the data's start."""
        epoch, batches = at[0], at[1] + self._advance
        self._advance = 0
        if self.plan is not None:
            epoch, batches = epoch + batches // self.plan[0], batches % self.plan[0]
        return (epoch, max(0, batches)) if epoch >= 0 else (0, 0)

    def set_epoch(self, epoch: int) -> None:
        """An epoch begins (the data iterator says so)."""
        self.epoch, self.batches = epoch, 0

    def count(self, samples: int) -> None:
        """A batch of ``samples`` was yielded: a step for the hang detector; unless a
        resume skips it (consumed before), one batch taken, the position written and
        samples for ``samples_per_s``."""
        self.batches += 1
        TRACKER.step(batch=True)
        if self.skip:  # consumed before: neither taken again nor written again
            self.skip -= 1
            return
        self.taken += 1
        if self._position is not None:
            if self._ended:  # a script that iterates again after an end (shard per epoch)
                self._position.trained(False)
            self._position.write(self.epoch, self.batches, self.taken)
        self._ended = False
        self._metrics.count(samples)

    def ending(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``, then :meth:`end` once they are exhausted (a loop that breaks out
        ends the steps for now, not the data)."""
        try:
            yield from batches
        finally:
            TRACKER.data_end()
        self.end()

    def end(self) -> None:
        """The data's end: no more steps expected; the callbacks of :meth:`on_end` run."""
        TRACKER.data_end()
        self._ended = True
        for callback in list(self._on_end):
            callback()

    def trained(self) -> None:
        """A position kept says this worker's training is over (its last round with
        its peers done): its death is not replaced in place until it takes a batch
        again (:meth:`dmlctl.runtime.rejoin.Position.trained`)."""
        if self._position is not None:
            self._position.trained(True)

    def close(self) -> None:
        """This rank's part is over: a position kept says so (its death is then not
        replaced in place)."""
        if self._position is not None:
            self._position.finish()

    def on_end(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at :meth:`end`."""
        self._on_end.append(callback)

    def progress(self, total_steps: int | None, step: int) -> dict[str, Any]:
        """``epoch`` and ``progress`` (0 to 1) of a record at ``step``: from
        ``total_steps`` when the script set it, else from the plan; nothing when
        neither is known."""
        if total_steps is not None and total_steps > 0:
            return {PROGRESS: min(1.0, max(0.0, (step + 1) / total_steps))}
        if self.plan is None:
            return {}
        per_epoch, epochs = self.plan
        done = self.epoch * per_epoch + self.batches
        return {"epoch": self.epoch, PROGRESS: min(1.0, done / (per_epoch * epochs))}
