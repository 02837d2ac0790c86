"""An accelerate tracker: what ``accelerator.log({...}, step=…)`` logs on the
dashboard, from every rank.

    from dmlctl.integrations.accelerate import DmlctlTracker

    accelerator = Accelerator(log_with=[DmlctlTracker()])
    accelerator.init_trackers("my-run")
    accelerator.log({"loss": loss.item(), "lr": scheduler.get_last_lr()[0]}, step=step)

Needs ``pip install 'dmlctl[accelerate]'``; outside a dmlctl run it does nothing.
"""

from __future__ import annotations

from typing import Any

from accelerate.tracking import GeneralTracker

from dmlctl.integrations.records import LibraryRecords


class DmlctlTracker(GeneralTracker):  # type: ignore[misc]  # accelerate is untyped here
    """Sends each ``accelerator.log`` to dmlctl (module docstring)."""

    name = "dmlctl"
    requires_logging_directory = False
    main_process_only = False  # every rank its own row

    def __init__(self) -> None:
        super().__init__()
        self._records = LibraryRecords()

    @property
    def tracker(self) -> LibraryRecords:
        return self._records

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The configuration stays in the job file and the script: nothing to send."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self._records.write(step or 0, values)
