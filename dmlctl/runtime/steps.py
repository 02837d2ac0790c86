"""One batch's forward and backward, or forward alone, under every layout
(:func:`run_step`): the part of :class:`~dmlctl.runtime.context.Context` behind
``train_step`` and ``eval_step``. A model that runs its own schedule (a pipeline
stage) provides ``train_step`` / ``eval_step`` methods with the same arguments, and
they are called instead."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

from dmlctl.runtime.parallel.hints import reshape_hint

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def run_step(
    model: torch.nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    loss_fn: LossFn,
    *,
    device: torch.device,
    tensor_degree: int,
    train: bool,
) -> torch.Tensor:
    """The batch's loss, detached, computed on ``device``: with ``train``,
    ``loss_fn(model(inputs), targets).backward()``; without, under ``no_grad``. A
    pipelined model's own step returns its last stage's loss."""
    inputs, targets = batch[0].to(device), batch[1].to(device)
    own = getattr(model, "train_step" if train else "eval_step", None)
    with reshape_hint(tensor_degree):
        if callable(own):
            return own(inputs, targets, loss_fn)  # type: ignore[no-any-return]
        with nullcontext() if train else torch.no_grad():
            loss = loss_fn(model(inputs), targets)
        if train:
            torch.autograd.backward(loss)
    return loss.detach()
