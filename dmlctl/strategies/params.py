"""What every strategy's parameter model shares (torch-free): its config, its bounds
and the role sets.

Parameters are validated strictly (a ``true`` is not a number, ``1.0`` is not a step
count), non-finite floats are refused, and every number has an upper bound, so a
job file cannot ask for a period of ``1e29`` steps.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dmlctl.protocol import ROLE_SERVER, ROLE_WORKER

PARAMS_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
"""Model config of every strategy's ``Params``."""

MAX_PERIOD = 1_000_000
"""Most steps of a period (steps between exchanges, pushes, fetches; staleness)."""

MAX_STEPS = 1_000_000_000
"""Most steps of a warm-up."""

MAX_LOW_RANK = 1024
"""Largest rank of a low-rank approximation (PowerSGD's r)."""

MAX_WEIGHT = 1e6
"""Largest weight, penalty or rate (ρ, c, scales, compression rates)."""

WORKERS_ONLY: tuple[str, ...] = (ROLE_WORKER,)
"""``ROLES`` of a strategy whose every rank trains."""

WITH_SERVERS: tuple[str, ...] = (ROLE_WORKER, ROLE_SERVER)
"""``ROLES`` of a parameter-server strategy: workers and server ranks."""


class FinalModel(BaseModel):
    """The ``final`` parameter of the strategies whose replicas drift apart during
    training (local-sgd, dpsgd, bmuf, easgd, admm, easgd-async)."""

    model_config = PARAMS_CONFIG

    final: Literal["consensus", "local"] = Field(
        default="consensus",
        description="At the end of training every worker takes the model the algorithm "
        "defines (the average, the block-updated global model, the center, z), so every "
        "rank saves the same result; 'local' keeps each worker's own replica.",
    )
