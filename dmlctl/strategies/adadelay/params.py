"""The parameters of an ``adadelay`` job (torch-free: the control plane validates job
files with it). The strategy is :mod:`dmlctl.strategies.adadelay.strategy`."""

from __future__ import annotations

import math

from pydantic import Field

from dmlctl.strategies.params import (
    MAX_WEIGHT,
    PARAMS_CONFIG,
    FetchEvery,
    PushCompression,
    derived_weight,
    server_capabilities,
)

QUALITY = (
    "AdaDelay replaces your optimizer with plain SGD steps on the servers, and plain "
    "SGD trains a transformer far slower than AdamW or Nesterov: the language model "
    "ends +44.5 % with AdamW and +24.8 % with SGD + Nesterov against one process's "
    "validation loss after 3 epochs, +11.1 % and +9.5 % after 9, within 3 % after 24 "
    "(+1.7 %, +0.8 %). Against one process with plain SGD it is not behind: 0.894 to "
    "its 1.016 at lr 2 (the best lr of 1, 2, 4, 8: 0.909) after 3 epochs; L = 0.25 "
    "stops learning. Use asgd or ssp for transformers. Digits within 2.5 points (its "
    "step shrinks as delays grow)."
)


class Params(PushCompression):
    """``strategy.params`` of an ``adadelay`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    n_fetch: FetchEvery = 1
    L: float | None = derived_weight(
        "1/lr (SGD); √(1−μ)/lr (momentum); 1/(100·lr) (Adam …)",
        "L, the smoothness constant: the largest step is 1/L. Default from your optimizer, "
        "which AdaDelay replaces: 1/lr for SGD; with momentum μ, 1/L is lr/√(1 − μ), the "
        "geometric mean of lr and the steady-state step lr/(1 − μ); 1/(100·lr) for Adam "
        "and the like (an SGD step 100× their lr: 0.1 for 1e-3).",
        most=1e12,
    )
    c: float = Field(default=0.1, ge=0, le=MAX_WEIGHT)
    """Scale of the adaptive, delay-weighted term c_j (0: constant step 1/L)."""


ADAPTIVE_TO_SGD = 100.0
"""An SGD learning rate that does what an adaptive optimizer's (Adam's) ``lr`` does,
as a multiple of it: the usual pairing of 0.1 with 1e-3."""


def resolve_l(params: Params, family: str | None, lr: float, effective: float | None) -> float:
    """L in use: ``params.L``, else derived from the optimizer AdaDelay replaces
    (``family``, its ``lr`` and ``effective`` step: see
    :mod:`dmlctl.strategies.optimizers`): the largest step 1/L is ``√(lr · effective)``
    for the SGD families (``lr`` for plain SGD; with momentum, between ``lr`` and the
    steady-state step, which as one plain asynchronous step trained to chance on
    digits) and ``100 · lr`` for the adaptive family. Raises ValueError naming ``L``
    when the optimizer gives nothing to derive it from."""
    if params.L is not None:
        return params.L
    if family == "adaptive" and lr > 0:
        return 1.0 / (ADAPTIVE_TO_SGD * lr)
    if family in ("sgd", "momentum") and effective is not None and effective > 0 and lr > 0:
        return 1.0 / math.sqrt(lr * effective)
    raise ValueError(
        f"adadelay: L defaults from the optimizer's lr, but its lr is {lr:g} and its kind"
        f" is {family or 'unknown'}; set strategy.params.L (1/L is the largest SGD step)"
    )


CAPABILITIES = server_capabilities()
