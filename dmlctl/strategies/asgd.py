"""Asynchronous SGD on parameter servers (Downpour SGD, Dean et al., NIPS 2012).

Each worker trains on its own batches with the user's optimizer and talks to the
servers without waiting for the other workers: every ``n_push`` steps it pushes the
change of its parameters since its last push (with plain SGD and ``n_push = 1`` that
is ``-lr·g``, the gradient push), every ``n_fetch`` steps it pulls the servers'
parameters and continues from them plus what it has not pushed yet. A server adds
every delta the moment it arrives, multiplied by ``scale`` (default ``1/p`` for
``p`` workers, so ``p`` deltas move the model as far as one synchronous step of the
averaged gradient; ``scale: 1`` is Downpour's sum). The staleness of every applied
update — updates the shard got between the pushing worker's last pull and its push —
is measured and reported (median / max on the server's dashboard row).

Parameters are sharded over the job's ``parameter_servers`` (size-balanced); server
state (parameters, versions, clocks) is part of checkpoints. See
:mod:`dmlctl.ps.worker` for the worker's step and the end of training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from dmlctl.strategies import ps_common
from dmlctl.strategies.params import MAX_PERIOD, MAX_WEIGHT, PARAMS_CONFIG
from dmlctl.strategies.registry import params_as

if TYPE_CHECKING:
    import torch

    from dmlctl.runtime.context import Context

ROLES = ps_common.ROLES
serve = ps_common.serve


class Params(BaseModel):
    """``strategy.params`` of an ``asgd`` job (all optional; unknown keys are errors)."""

    model_config = PARAMS_CONFIG

    n_push: int = Field(
        default=1, ge=1, le=MAX_PERIOD, description="Push the local change every n_push steps."
    )
    n_fetch: int = Field(
        le=MAX_PERIOD,
        default=1, ge=1, description="Pull fresh parameters from the servers every n_fetch steps."
    )
    scale: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WEIGHT,
        description="Weight the servers give a pushed change; default 1/workers (1: "
        "Downpour's plain sum, p times the step of synchronous SGD).",
    )


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers and wrap ``optimizer`` (collective with the servers)."""
    p = params_as(Params, params)
    rule = ps_common.delta_rule(p.scale, ctx.world_size)
    return ps_common.prepare_worker(
        ctx, model, optimizer, rule=rule, mode="delta",
        n_push=p.n_push, n_fetch=p.n_fetch,
    )  # fmt: skip
