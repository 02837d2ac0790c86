"""The parameters of an ``admm`` job (torch-free: the control plane validates job
files with it). The update rules are :mod:`dmlctl.strategies.admm.strategy`'s."""

from __future__ import annotations

from typing import Literal

from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    WORKERS_ONLY,
    Capabilities,
    FinalModel,
    Steps,
    derived_weight,
)

QUALITY = (
    "the language model ends +8.1 % with AdamW and +3.0 % with SGD + Nesterov against "
    "one process's validation loss after 3 epochs: ρ trades each worker's progress "
    "(small ρ) against their agreement (large ρ), and with AdamW no ρ from 0.001 to 1 "
    "and no local_steps from 5 to 20 came within 3 % (best +7.1 % at ρ 0.003); after "
    "6 epochs +3.1 % with AdamW and +2.3 % with SGD + Nesterov (ρ 0.003: +3.2 % and "
    "+1.8 %), after 9 +0.5 % and +1.1 %. Digits within 0.3 points."
)


RHO_RULE = "min(1, 0.5/(k·η)) (SGD, η = lr/(1−μ)); 0.01 (Adam …)"
"""How ρ is derived when a job leaves it out (:func:`derive_rho`; admm and aadmm)."""


class Params(FinalModel):
    """``strategy.params`` of an ``admm`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    rho: float | None = derived_weight(
        RHO_RULE,
        "ρ, the penalty on disagreement with the consensus z: larger keeps workers closer "
        "(smaller primal residual) but slows each one's progress. Default from your "
        "optimizer: 0.01 for Adam and the like; for SGD min(1, 0.5/(k·η)) with k = "
        "local_steps and η the steady-state step lr/(1 − momentum), so one round's pull "
        "removes at most half the disagreement.",
    )
    local_steps: Steps = 10
    """k: optimizer steps per round approximating the x-update; one all-reduce of the parameters'
    size per round."""
    init: Literal["average", "broadcast"] = "average"
    """'average': z starts at the mean of the initial models; 'broadcast': rank 0's model is copied
    to every worker and z starts there."""


ADAPTIVE_RHO = 0.01
"""ρ for the adaptive family. Adam normalises the sum of the loss's gradient and the
penalty's, so what counts is ρ‖x − z + u‖ against the gradient's size: with ρ = 1 the
penalty drowned the loss on digits (0.956 test accuracy against 0.981 with 0.1); on
the language-model table (AdamW, a transformer whose gradients are clipped to norm 1)
0.1 ended 58 % above one process's validation loss, 0.01 8 %, 0.003 7 %; on digits
0.003 to 0.1 are all within 0.3 points."""

SGD_RHO = 1.0
"""Most ρ for the SGD families."""

MAX_PULL = 0.5
"""For the SGD families, the default ρ keeps ``k η ρ`` (about the share of the
disagreement one round of k steps removes, η the steady-state step) at most this: a
pull of half per step (``η ρ = 0.5``, the earlier rule) held the language model's
workers back (+24 % validation loss with Nesterov, +3.0 % at ``k η ρ = 0.5``)."""


def resolve_rho(
    params: Params, family: str | None, effective: float | None, strategy: str = "admm"
) -> float:
    """ρ in use: ``params.rho``, else derived from the optimizer (``family`` and its
    ``effective`` step, see :mod:`dmlctl.strategies.optimizers`) and ``local_steps``
    k: ``0.01`` for the adaptive family, ``min(1, 0.5/(k·η))`` for SGD with or without
    momentum. Raises ValueError naming ``strategy`` and ``rho`` for an optimizer it
    cannot derive it from. (``aadmm`` derives its ρ the same way.)"""
    return derive_rho(params.rho, family, effective, strategy, params.local_steps)


def derive_rho(
    rho: float | None,
    family: str | None,
    effective: float | None,
    strategy: str,
    local_steps: int,
) -> float:
    """:func:`resolve_rho` for a ρ given as a number (None: derive it) and ``local_steps``
    optimizer steps per round."""
    if rho is not None:
        return rho
    if family == "adaptive":
        return ADAPTIVE_RHO
    if family in ("sgd", "momentum") and effective is not None and effective > 0:
        return min(SGD_RHO, MAX_PULL / (max(local_steps, 1) * effective))
    raise ValueError(
        f"{strategy}: rho defaults from the optimizer, which is of an unknown kind "
        f"(step {effective}); set strategy.params.rho"
    )


CAPABILITIES = Capabilities(roles=WORKERS_ONLY, columns=("primal_res", "dual_res"), in_place=True)
