"""A Lightning logger: what a ``LightningModule`` logs (``self.log("loss", …)``, the
epoch, a ``LearningRateMonitor``'s rate, a ``ThroughputMonitor``'s samples/s) on the
dashboard.

    from dmlctl.integrations.lightning import DmlctlLogger

    trainer = lightning.Trainer(logger=DmlctlLogger(), max_epochs=3)

Needs ``pip install 'dmlctl[lightning]'``; outside a dmlctl run it does nothing.
Every rank logs its own row (Lightning gives every rank's logger its values).
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers.logger import Logger

from dmlctl.integrations.records import LibraryRecords


class DmlctlLogger(Logger):
    """Sends each of Lightning's ``log_metrics`` to dmlctl (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._records = LibraryRecords()

    @property
    def name(self) -> str:
        return "dmlctl"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = {_short(k): v for k, v in metrics.items()}
        self._records.write(step or 0, values)

    def log_hyperparams(
        self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any
    ) -> None:
        """Hyperparameters stay in the job file and the script: nothing to send."""


def _short(key: str) -> str:
    """``loss`` for Lightning's ``train_loss_step``/``loss_step``, ``lr`` for a
    ``LearningRateMonitor``'s ``lr-AdamW``; other keys as they are."""
    if key.endswith("_step"):
        key = key[: -len("_step")]
    return "lr" if key.startswith("lr-") else key
