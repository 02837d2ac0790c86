"""``none``: plain torchrun semantics — dmlctl applies no training strategy.

The script runs exactly as under torchrun (it may build its own DDP, FSDP, or
anything else); :meth:`Context.prepare` only moves the model to the rank's device.
This is what ``dmlctl status`` shows for a run whose script never let a strategy wrap
its model. Importing this module never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import torch

    from dmlctl.runtime.context import Context

ROLES: tuple[str, ...] = ("worker",)
NEEDS_RUNTIME = False  # the script may bypass ctx.prepare: nothing is lost


class Params(BaseModel):
    """``none`` has no parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Return both objects unchanged (the model is already on ``ctx.device``)."""
    return model, optimizer
