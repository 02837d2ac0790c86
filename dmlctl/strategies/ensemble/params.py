"""The parameters of an ``ensemble`` job (torch-free: the control plane validates job
files with it). The update rule is :mod:`dmlctl.strategies.ensemble.strategy`'s."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    WORKERS_ONLY,
    Capabilities,
    FinalModel,
    Steps,
)

QUALITY = (
    "the language model ends +7.7 % with AdamW and +5.4 % with SGD + Nesterov against "
    "one process's validation loss after 3 epochs, more than 3 %: workers train apart "
    "for a period (50 steps) and a round distils the ensemble into each of them "
    "instead of averaging, which recovers only part of the difference; more "
    "distillation steps (100) or longer periods (100) did not close it. After 6 "
    "epochs +3.0 % with AdamW and +2.8 % with SGD + Nesterov, after 9 +0.5 % and "
    "+2.7 %."
)

MAX_TEMPERATURE = 100.0
"""Highest distillation temperature: beyond it every softened output is uniform to
float precision, so the targets carry nothing."""

MAX_MEMORY = 1024
"""Most recent training batches a worker keeps for distillation (memory: one copy of
each batch's inputs)."""


class Params(FinalModel):
    """``strategy.params`` of an ``ensemble`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    period: Steps = 50
    """H: local steps between two ensemble rounds. Each round gathers every worker's model (an
    all-gather of the parameters) and distills the ensemble into each worker's own model."""
    temperature: float = Field(default=2.0, gt=0, le=MAX_TEMPERATURE)
    """T: the ensemble's targets are the mean of softmax(logits/T) over the workers' models, and
    each worker matches them with softmax(own/T); the loss is scaled by T² so its gradients keep
    their size as T changes."""
    distill_steps: Steps = 20
    """Steps of your optimizer on the distillation loss per round, cycling over the remembered
    batches (not counted as training steps)."""
    memory: int = Field(default=8, ge=1, le=MAX_MEMORY)
    """How many of its most recent training batches each worker keeps (their inputs) as the local
    data it labels with the ensemble and distills on."""
    final: Literal["consensus", "local"] = "consensus"
    """At the end of training a last ensemble round, then every worker takes rank 0's distilled
    model, so every rank saves the same result; 'local' skips both and keeps each worker's own
    model."""


CAPABILITIES = Capabilities(roles=WORKERS_ONLY)
