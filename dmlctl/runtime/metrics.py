"""Metric emission for one rank: what ``Context.log`` does.

Under dmlctl (``DMLCTL_RANK_DIR`` set) every call appends one ``metric`` record to
``rank-<R>.events.jsonl`` through :class:`dmlctl.protocol.RankEventWriter`; the host
agent tails that file, so logging never blocks on a pipe. Without it (plain
``python train.py`` or bare torchrun) rank 0 prints one line ``step 10 loss=0.1234 …``
(without the cumulative :data:`~dmlctl.protocol.COMM_TOTALS`, which only the
controller reads) and the other ranks stay silent.

Cost: one ``.item()`` per tensor value (a device sync on GPU), nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dmlctl.protocol import COMM_TOTALS, RankEventWriter, rank_event_writer

Scalar = float | int | str

THROUGHPUT_KEY = "samples_per_s"


def to_scalar(name: str, value: Any) -> Scalar:
    """A metric value as a JSON scalar: tensors (one element) and floats become float.

    Python ints and strings are kept; bools become ints. Raises ``ValueError`` for
    a tensor with more than one element and ``TypeError`` for anything not numeric.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}"
            )
        return float(value.detach().item())
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str):
        return value
    try:
        return float(value)  # python/numpy floats, 0-d arrays
    except (TypeError, ValueError):
        raise TypeError(
            f"metric {name!r} must be a number or a scalar tensor, got {type(value).__name__}"
        ) from None


def format_value(value: Scalar) -> str:
    """Short, readable rendering of one value for the console line."""
    if isinstance(value, float):
        magnitude = abs(value)
        if value == 0 or 1e-3 <= magnitude < 100:
            return f"{value:.4f}"
        if 100 <= magnitude < 1e12:
            return f"{value:.1f}"
        return f"{value:.3e}"
    return str(value)


class MetricLogger:
    """Steps, throughput and the destination of one rank's metrics.

    * ``step=None`` means "previous step + 1" (the first automatic step is 0); an
      explicit step resets the counter, so automatic steps continue after it.
    * A record gets ``samples_per_s`` when samples were counted (by the data
      iterator, through :meth:`count`) since the previous record: those samples
      divided by the wall time since the previous record, or since :meth:`start_clock`
      for the first one. A caller-supplied ``samples_per_s`` is kept as given.
    * ``check(step, values)``, when given, sees every record's converted values after
      the record is written (the divergence guard raises from it).
    """

    def __init__(
        self,
        rank: int,
        rank_dir: str | None,
        check: Callable[[int, Mapping[str, Scalar]], None] | None = None,
    ) -> None:
        self._rank = rank
        self._check = check
        self._rank_dir = rank_dir
        self._writer: RankEventWriter | None = None
        self._next_step = 0
        self._samples = 0
        self._clock_started = False
        self._since = time.perf_counter()

    @property
    def next_step(self) -> int:
        """The step a record without an explicit step gets."""
        return self._next_step

    def start_clock(self) -> None:
        """Start measuring throughput now, unless it is already measured."""
        if not self._clock_started:
            self._clock_started = True
            self._samples = 0
            self._since = time.perf_counter()

    def count(self, samples: int) -> None:
        """Add ``samples`` consumed by this rank (called by the data iterator)."""
        self._samples += samples

    def log(self, step: int | None, metrics: Mapping[str, Any]) -> int:
        """Record ``metrics`` at ``step`` (or the automatic step); return the step used."""
        if step is None:
            step = self._next_step
        elif isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        self._next_step = step + 1
        values = {name: to_scalar(name, v) for name, v in metrics.items()}
        now = time.perf_counter()
        if self._samples > 0 and THROUGHPUT_KEY not in values:
            values[THROUGHPUT_KEY] = self._samples / max(now - self._since, 1e-9)
        self._samples = 0
        self._since = now
        writer = self._records()
        if writer is not None:
            writer.metric(step, values)
        elif self._rank == 0:  # the run totals are for the controller, not this line
            shown = {k: v for k, v in values.items() if k not in COMM_TOTALS}
            line = " ".join(f"{k}={format_value(v)}" for k, v in shown.items())
            print(f"step {step} {line}".rstrip(), flush=True)
        if self._check is not None:
            self._check(step, values)
        return step

    def _records(self) -> RankEventWriter | None:
        """The rank's one record writer (:func:`~dmlctl.protocol.rank_event_writer`), or
        None without a rank dir."""
        if self._rank_dir is not None and (self._writer is None or self._writer.closed):
            self._writer = rank_event_writer(self._rank_dir, self._rank)
        return self._writer

    def checkpoint(self, step: int, directory: str) -> None:
        """Record that this rank committed checkpoint ``step`` (for the controller)."""
        writer = self._records()
        if writer is not None:
            writer.checkpoint(step, directory)

    def prepared(self, strategy: str) -> None:
        """Record that ``ctx.prepare`` applied ``strategy`` (for the controller)."""
        writer = self._records()
        if writer is not None:
            writer.prepared(strategy)

    def close(self) -> None:
        """Stop using the record file (the rank's entry point closes it, after the exit
        record; a later :meth:`log` takes it up again)."""
        self._writer = None
