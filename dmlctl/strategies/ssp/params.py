"""The parameters of an ``ssp`` job (torch-free: the control plane validates job
files with it). The strategy is :mod:`dmlctl.strategies.ssp.strategy`."""

from __future__ import annotations

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    Count,
    PushCompression,
    derived_weight,
    server_capabilities,
)

QUALITY = (
    "the language model ends +5.0 % with AdamW and +0.1 % with SGD + Nesterov against "
    "one process's validation loss after 3 epochs (asynchronous: AdamW +3.7 to +6.0 % "
    "in four runs), more than 3 % with AdamW, as asgd; after 6 epochs +1.6 % with "
    "AdamW and −0.7 % with SGD + Nesterov, after 9 −0.5 % and +0.8 %. Digits within "
    "0.3 points."
)


class Params(PushCompression):
    """``strategy.params`` of an ``ssp`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    staleness: Count = 3
    """s: the most clocks a worker may be ahead of the slowest one (0: synchronous)."""
    scale: float | None = derived_weight(
        "1/workers", "Weight the servers give a pushed change; default 1/workers."
    )


CAPABILITIES = server_capabilities()
