"""The parameters of an ``adadelay`` job (torch-free: the control plane validates job
files with it). The strategy is :mod:`dmlctl.strategies.adadelay.strategy`."""

from __future__ import annotations

from pydantic import BaseModel, Field

from dmlctl.strategies.params import MAX_PERIOD, MAX_WEIGHT, PARAMS_CONFIG, WITH_SERVERS

ROLES: tuple[str, ...] = WITH_SERVERS


class Params(BaseModel):
    """``strategy.params`` of an ``adadelay`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    n_fetch: int = Field(
        le=MAX_PERIOD,
        default=1,
        ge=1,
        description="Pull fresh parameters from the servers every n_fetch steps.",
    )
    L: float | None = Field(
        default=None,
        gt=0,
        le=1e12,
        description="L, the smoothness constant: the largest step is 1/L; default "
        "1/lr of the optimizer.",
    )
    c: float = Field(
        default=0.1,
        ge=0,
        le=MAX_WEIGHT,
        description="Scale of the adaptive, delay-weighted term c_j (0: constant step 1/L).",
    )
