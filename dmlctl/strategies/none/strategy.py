"""``none``'s strategy: nothing (see :mod:`dmlctl.strategies.none.params`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Return both objects unchanged (the model is already on ``ctx.device``)."""
    return model, optimizer
