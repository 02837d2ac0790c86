"""The parameters of a ``sync-ps`` job and its world check (torch-free: the control
plane validates job files with it). The strategy is
:mod:`dmlctl.strategies.sync_ps.strategy`."""

from __future__ import annotations

from pydantic import BaseModel

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    Count,
    PushCompression,
    server_capabilities,
)

QUALITY = (
    "the language model (3 epochs) ends −0.1 % with AdamW and +0.9 % with SGD + "
    "Nesterov against one process's validation loss (bound 3 %), digits within 0.3 "
    "points."
)


class Params(PushCompression):
    """``strategy.params`` of a ``sync-ps`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    backup_workers: Count = 0
    """b: the servers step once K − b of the K workers' gradients for a step are in and drop the
    late ones (0: wait for every worker, which is synchronous SGD). Fewer than the workers."""


def check_world(params: BaseModel, world_size: int) -> str | None:
    """Why the job cannot run on ``world_size`` workers (every worker a backup), or None."""
    b = Params.model_validate(params.model_dump()).backup_workers
    if b >= world_size:
        return (
            f"backup_workers is {b}, but there are {world_size} workers: at least one "
            f"gradient must count (set backup_workers below {world_size})"
        )
    return None


CAPABILITIES = server_capabilities("dropped", check_world=check_world)
