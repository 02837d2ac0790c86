"""The one place the integrations write from: a library's logged values, named as the
dashboard names them, as this rank's metric records (:class:`MetricLogger`).

Every rank writes its own records (the dashboard has a row per rank). Outside a dmlctl
run (no rank directory) nothing is written and nothing is printed: the library's own
logging is the user's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from dmlctl.protocol import ENV_RANK_DIR
from dmlctl.runtime.metrics import THROUGHPUT_KEY, MetricLogger

NAMES = {
    "loss": "loss",
    "train_loss": "loss",
    "train/loss": "loss",
    "learning_rate": "lr",
    "lr": "lr",
    "train/samples_per_sec": THROUGHPUT_KEY,
    "samples_per_s": THROUGHPUT_KEY,
}
"""What a library logs, by the name the dashboard gives it (the other values keep
their own names in ``metrics.jsonl``)."""


class LibraryRecords:
    """This rank's records of what a library logs (see the module docstring)."""

    def __init__(self) -> None:
        rank_dir = os.environ.get(ENV_RANK_DIR)
        rank = int(os.environ.get("RANK", "0"))
        self._log = MetricLogger(rank, rank_dir) if rank_dir else None
        self._last: tuple[int, float] | None = None  # (samples so far, when)

    def write(self, step: int, values: Mapping[str, Any], samples: int | None = None) -> None:
        """Record ``values`` at ``step``, named as the dashboard names them (numbers
        only: a library's text values are left out); ``samples``: this rank's samples
        so far, from which ``samples_per_s`` is made when the library gave none."""
        if self._log is None:
            return
        out: dict[str, float | int] = {}
        for key, value in values.items():
            number = _number(value)
            if number is not None:
                out[NAMES.get(key, key)] = number
        if "epoch" in out:  # a fractional epoch (the Trainer's): the dashboard counts whole ones
            out["epoch_float"], out["epoch"] = float(out["epoch"]), int(out["epoch"])
        now = time.perf_counter()
        if samples is not None and (self._last is None or samples > self._last[0]):
            if self._last is not None and THROUGHPUT_KEY not in out:  # a log at the same step
                out[THROUGHPUT_KEY] = (samples - self._last[0]) / (now - self._last[1])  # adds none
            self._last = (samples, now)
        if out:
            self._log.log(int(step), out)


def _number(value: Any) -> float | int | None:
    """``value`` as a number (a one-element tensor's too; NaN stays: a diverging loss
    is shown as such), else None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number
