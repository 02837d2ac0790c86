"""The parameters of an ``admm`` job (torch-free: the control plane validates job
files with it). The update rules are :mod:`dmlctl.strategies.admm.strategy`'s."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from dmlctl.strategies.params import MAX_PERIOD, MAX_WEIGHT, PARAMS_CONFIG, WORKERS_ONLY

ROLES: tuple[str, ...] = WORKERS_ONLY


class Params(BaseModel):
    """``strategy.params`` of an ``admm`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    rho: float = Field(
        default=1.0,
        gt=0,
        le=MAX_WEIGHT,
        description="ρ, the penalty on disagreement with the consensus z: larger "
        "keeps workers closer (smaller primal residual) but slows each one's progress.",
    )
    local_steps: int = Field(
        default=10,
        ge=1,
        le=MAX_PERIOD,
        description="k: optimizer steps per round approximating the x-update; one "
        "all-reduce of the parameters' size per round.",
    )
    init: Literal["average", "broadcast"] = Field(
        default="average",
        description="'average': z starts at the mean of the initial models; "
        "'broadcast': rank 0's model is copied to every worker and z starts there.",
    )
