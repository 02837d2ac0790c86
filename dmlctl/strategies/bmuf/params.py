"""The parameters of a ``bmuf`` job (torch-free: the control plane validates job files
with it). The update rule is :mod:`dmlctl.strategies.bmuf.strategy`'s."""

from __future__ import annotations

from pydantic import Field, field_validator

from dmlctl.strategies.params import (
    MAX_PERIOD,
    MAX_WEIGHT,
    PARAMS_CONFIG,
    WORKERS_ONLY,
    Averaging,
    Capabilities,
    at_least,
    derived,
    threshold_in_place,
)

QUALITY = (
    "the language model (3 epochs) ends +1.6 % with AdamW and −0.0 % with SGD + "
    "Nesterov against one process's validation loss (bound 3 %; the default block "
    "momentum is 0 on top of Adam's β₁, 1 − 1/N ended +10.8 %), digits within 0.3 "
    "points."
)


class Params(Averaging):
    """``strategy.params`` of a ``bmuf`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    period: int = Field(le=MAX_PERIOD, default=8)
    """τ: local steps per block; one all-reduce of the model per block."""
    block_momentum: float | None = Field(
        default=None,
        json_schema_extra=derived("0 with momentum or Adam; 1 − 1/workers with plain SGD"),
        allow_inf_nan=False,
    )
    """η_b in [0, 1): momentum of the block updates. Default: 0 when your optimizer already carries
    momentum (SGD with momentum or Nesterov, Adam's β₁, RMSprop's momentum: the two momenta
    compound), else the paper's 1 − 1/N for N workers. 0 (with block_lr 1) is plain model
    averaging."""
    block_lr: float = Field(le=MAX_WEIGHT, default=1.0, allow_inf_nan=False)
    """ζ > 0: step size applied to each block's averaged update."""
    nesterov: bool = False
    """Workers restart a block from w_g + η_b·Δ (Nesterov block momentum) instead of w_g."""

    _period = field_validator("period")(at_least("period", 1, "local steps per block"))
    _lr = field_validator("block_lr")(at_least("block_lr", 0, above=True))

    @field_validator("block_momentum")
    @classmethod
    def _momentum(cls, value: float | None) -> float | None:
        if value is not None and value >= 1:
            raise ValueError(f"block momentum must be < 1, got {value}")
        if value is not None and value < 0:
            raise ValueError(f"block momentum must be ≥ 0, got {value}")
        return value


def resolve_block_momentum(value: float | None, world_size: int, momentum: bool) -> float:
    """``value``, or the default: ``0`` when the inner optimizer carries ``momentum``
    (:func:`dmlctl.strategies.optimizers.carries_momentum`: SGD with momentum or
    Nesterov, Adam's first moment — each update already goes on over later steps, and
    block momentum on top compounds with it: the step grows by
    ``1/((1 − μ)(1 − η_b))``), else the paper's ``1 − 1/N`` for ``N = world_size``
    workers."""
    if value is not None:
        return value
    if momentum:
        return 0.0
    return 1.0 - 1.0 / max(world_size, 1)


CAPABILITIES = Capabilities(
    roles=WORKERS_ONLY,
    columns=("consensus",),
    in_place=True,
    in_place_rule=threshold_in_place,
)
