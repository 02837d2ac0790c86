"""The parameters of an ``aadmm`` job and its world check (torch-free: the control
plane validates job files with it). The strategy is
:mod:`dmlctl.strategies.aadmm.strategy`."""

from __future__ import annotations

from pydantic import BaseModel

from dmlctl.strategies.admm.params import RHO_RULE
from dmlctl.strategies.params import (
    PARAMS_CONFIG,
    FinalModel,
    Overlap,
    Steps,
    derived_steps,
    derived_weight,
    server_capabilities,
)

QUALITY = (
    "as admm with every worker in each round: the language model ends +8.1 % with "
    "AdamW and +3.0 % with SGD + Nesterov against one process's validation loss after "
    "3 epochs, more than 3 % with AdamW (see `dmlctl strategies admm`); after 6 "
    "epochs +3.1 % with AdamW and +2.5 % with SGD + Nesterov, after 9 +0.6 % and "
    "+0.6 %. Digits within 0.3 points."
)


class Params(FinalModel, Overlap):
    """``strategy.params`` of an ``aadmm`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    rho: float | None = derived_weight(
        RHO_RULE,
        "ρ, the penalty on disagreement with the consensus z; derived from your optimizer "
        "as for admm.",
    )
    local_steps: Steps = 10
    """Optimizer steps on the proximal problem between two pushes of (w, λ) to the servers."""
    min_workers: int | None = derived_steps(
        "workers",
        "K₀, the partial barrier: the servers update z once at least this many workers "
        "reported since the last update. Default: every worker (the synchronous z "
        "sequence); fewer lets fast workers go on without a straggler, at some accuracy "
        "(digits, 2 workers, K₀ = 1: 0.953 against 0.969 with SGD + momentum).",
    )
    max_delay: Steps = 4
    """τ: a worker may miss at most this many updates of z; one whose delay reached τ is waited
    for."""


def resolve_min_workers(params: Params, workers: int) -> int:
    """K₀ in use: ``params.min_workers``, else every worker."""
    return params.min_workers if params.min_workers is not None else workers


def check_world(params: BaseModel, world_size: int) -> str | None:
    """Why the job cannot run on ``world_size`` workers (K₀ above it), or None."""
    p = Params.model_validate(params.model_dump())
    if p.min_workers is not None and p.min_workers > world_size:
        return (
            f"min_workers is {p.min_workers}, but there are only {world_size} workers "
            f"(set min_workers to at most {world_size})"
        )
    return None


CAPABILITIES = server_capabilities("primal_res", "delay_max", check_world=check_world)
