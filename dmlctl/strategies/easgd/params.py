"""The parameters of an ``easgd`` job and the check of α against the worker count
(torch-free: the control plane imports it). The update rules are
:mod:`dmlctl.strategies.easgd.strategy`'s."""

from __future__ import annotations

from typing import Protocol

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    WORKERS_ONLY,
    Averaging,
    Capabilities,
    Share,
    Steps,
    derived_weight,
    threshold_in_place,
)

QUALITY = (
    "the language model ends +3.2 % with AdamW and +4.3 % with SGD + Nesterov against "
    "one process's validation loss after 3 epochs, more than 3 %: the center moves by "
    "α = β/N of the workers' spread once a period, so early in training it trails "
    "them; after 6 epochs +1.5 % with AdamW and +2.2 % with SGD + Nesterov, after 9 "
    "−0.8 % and +0.8 %. Period 1 or 8 and β 0.5 or 1 did not close it at 3 epochs. "
    "Digits within 0.3 points."
)


class Params(Averaging):
    """``strategy.params`` of an ``easgd`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    period: Steps = 4
    """τ: local steps between center updates (one all-reduce of the parameters' size per period)."""
    beta: Share = 0.9
    """β = pα: how far the center moves towards the workers' mean per update (β = 1: onto it). Used
    when alpha is not given."""
    alpha: float | None = derived_weight(
        "beta/workers",
        "α, the moving rate of the center; default β/p. Must be ≤ 1/p (checked against "
        "the job's worker count).",
    )
    rho: float | None = derived_weight(
        "alpha/lr",
        "ρ, the elastic force's strength: on each exchange a worker moves ηρ of the way "
        "to the center (η: the lr), applied directly, not through the optimizer; default "
        "α/η with η the lr at start, so the pull equals α for every optimizer.",
    )


class Elastic(Protocol):
    """The parameters that set α: easgd's and easgd-async's."""

    @property
    def alpha(self) -> float | None: ...

    @property
    def beta(self) -> float: ...


def resolve_alpha(params: Elastic, world_size: int) -> float:
    """α in use (easgd, easgd-async): ``params.alpha`` or ``β / p``."""
    return params.alpha if params.alpha is not None else params.beta / world_size


def resolve_rho(params: Params, alpha: float, lr: float) -> float:
    """ρ in use: ``params.rho`` or ``α / η``; raises ValueError when η is not positive."""
    if params.rho is not None:
        return params.rho
    if not lr > 0:
        raise ValueError(
            f"easgd: rho defaults to alpha / lr, but the optimizer's lr is {lr}; "
            "set strategy.params.rho"
        )
    return alpha / lr


def check_world(params: Params, world_size: int) -> str | None:
    """Why ``params`` cannot run on ``world_size`` workers, or None (α ≤ 1/p)."""
    alpha = resolve_alpha(params, world_size)
    bound = 1.0 / world_size
    if alpha > bound * (1 + 1e-12):
        return (
            f"alpha {alpha:g} > 1/p = {bound:g} for {world_size} workers: "
            "the center update would overshoot"
        )
    return None


CAPABILITIES = Capabilities(
    roles=WORKERS_ONLY,
    columns=("consensus",),
    check_world=check_world,
    in_place=True,
    in_place_rule=threshold_in_place,
)
