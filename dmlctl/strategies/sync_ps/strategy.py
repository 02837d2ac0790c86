"""Synchronous SGD on parameter servers, with backup workers (Chen, Pan, Monga,
Bengio & Jozefowicz, "Revisiting distributed synchronous SGD", 2016).

Every step each of the ``K`` workers pushes the gradient of the parameters it read
(version ``t``), tagged ``t``. A server takes the gradients tagged with its current
version; as soon as ``K − b`` are in (``b = backup_workers``) it steps **the user's
optimizer** (same class and hyperparameters, run on the server's shard) once on
their mean — version ``t + 1`` — and answers every worker waiting on round ``t``. A
gradient that arrives after its round closed is dropped (the server counts it,
``dropped``, in all and per worker) and its worker continues
from the newest parameters. So a slow worker no longer holds the others back; with
``b = 0`` every round waits for every worker, which is synchronous SGD with averaged
gradients: the same parameters as ``ssgd`` up to floating-point rounding.

The user's optimizer does not step on the workers (a notice says so); its state
(momentum, Adam's moments) lives on the servers and travels in checkpoints. Its
hyperparameters are read once, at start, except the learning rate: every push
carries the worker's current ``lr``, so a learning-rate scheduler on the workers
drives the servers' steps. When fewer than ``K − b`` workers are still training
(the others' data ran out) a round needs only those.

The parameters are :mod:`dmlctl.strategies.sync_ps.params`'s; this module imports
torch (hosts only).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel

from dmlctl.ps.bootstrap import join_as_worker
from dmlctl.ps.serve import serve
from dmlctl.ps.worker import Wiring
from dmlctl.strategies import optimizers
from dmlctl.strategies.registry import params_as
from dmlctl.strategies.sync_ps.mode import SyncGradientPush
from dmlctl.strategies.sync_ps.params import Params, check_world

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context

__all__ = ["prepare", "serve", "server_optimizer"]


def server_optimizer(optimizer: torch.optim.Optimizer) -> tuple[str, dict[str, Any]]:
    """The name in ``torch.optim`` and the constructor arguments that rebuild
    ``optimizer`` on a server's flat shard. Raises ValueError for an optimizer that
    is not one of ``torch.optim``'s or whose param groups differ in a setting (one
    flat shard has one set of hyperparameters)."""
    cls = type(optimizer)
    name = cls.__name__
    if getattr(torch.optim, name, None) is not cls:
        raise ValueError(
            f"sync-ps runs your optimizer on the parameter servers, so it must be one of "
            f"torch.optim's; got {cls.__module__}.{name}"
        )
    accepted = inspect.signature(cls.__init__).parameters
    groups = [
        {k: v for k, v in g.items() if k in accepted and k != "params"}
        for g in optimizer.param_groups
    ]
    if any(g != groups[0] for g in groups[1:]):
        raise ValueError(
            "sync-ps runs one optimizer per server shard: every param group must have "
            "the same settings (lr, weight decay, …)"
        )
    settings = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in groups[0].items()}
    return name, settings


def prepare(
    ctx: Context, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: BaseModel
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap the servers with the user's optimizer and wrap it (collective with
    the servers); says once that the servers step it. Raises ValueError for more
    backup workers than workers or an optimizer the servers cannot rebuild."""
    p = params_as(Params, params)
    problem = check_world(p, ctx.world_size)
    if problem is not None:
        raise ValueError(f"sync-ps: {problem}")
    name, settings = server_optimizer(optimizer)
    ctx.notice(
        f"sync-ps steps {optimizers.describe(optimizer)} on the parameter servers, once "
        f"{ctx.world_size - p.backup_workers} of {ctx.world_size} workers' gradients "
        "for a step are in"
    )
    rule = {"kind": "backup", "backup": p.backup_workers, "optimizer": name, "settings": settings}
    weights, layout = join_as_worker(ctx, model, rule=rule, push=p.push_spec())
    advice = f"lower the lr of {optimizers.describe(optimizer)} (the servers step it)"
    return model, SyncGradientPush(optimizer, weights, Wiring(ctx, layout), advice=advice)
