"""The parameters of an ``easgd-async`` job (torch-free: the control plane validates job
files with it). The strategy is :mod:`dmlctl.strategies.easgd_async.strategy`."""

from __future__ import annotations

from pydantic import Field

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    FinalModel,
    Overlap,
    PushCompression,
    Share,
    Steps,
    derived,
    server_capabilities,
)

QUALITY = (
    "the language model ends +5.3 % with AdamW and +5.8 % with SGD + Nesterov against "
    "one process's validation loss after 3 epochs (asynchronous), more than 3 %: the "
    "center trails the workers early, as with easgd; after 6 epochs +1.7 % with AdamW "
    "and +3.1 % with SGD + Nesterov, after 9 −0.6 % and +1.2 %. Digits within 0.3 "
    "points."
)


class Params(FinalModel, PushCompression, Overlap):
    """``strategy.params`` of an ``easgd-async`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    period: Steps = 4
    """τ: local steps between two exchanges with the center."""
    beta: Share = 0.9
    """β = pα; used when alpha is not given."""
    alpha: float | None = Field(default=None, json_schema_extra=derived("beta/workers"), gt=0, lt=1)
    """α, the elastic moving rate of one exchange; default β/p."""


CAPABILITIES = server_capabilities()
