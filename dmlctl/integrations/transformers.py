"""A Hugging Face ``Trainer`` callback: what the Trainer logs (loss, learning rate,
epoch, gradient norm …) on the dashboard, with this rank's samples/s and the run's
progress.

    from dmlctl.integrations.transformers import DmlctlCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[DmlctlCallback()])
    trainer.train()

Needs ``pip install 'dmlctl[hf]'``; outside a dmlctl run it does nothing.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from dmlctl.integrations.records import LibraryRecords


class DmlctlCallback(TrainerCallback):
    """Sends each of the Trainer's logs to dmlctl (see the module docstring)."""

    def __init__(self) -> None:
        self._records = LibraryRecords()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """One record at the Trainer's global step; ``progress`` from its planned steps."""
        values = dict(logs or {})
        values.pop("train_samples_per_second", None)  # every process's: this rank's is made
        if state.max_steps:
            values["progress"] = min(1.0, state.global_step / state.max_steps)
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self._records.write(state.global_step, values, samples=state.global_step * per_step)
