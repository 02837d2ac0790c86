"""What the parameter-server strategies (asgd, ssp, adadelay, easgd-async) share.

Each of those modules declares ``ROLES = ("worker", "server")``, its ``Params`` and
two functions the runtime calls: ``prepare`` on workers (through ``ctx.prepare``) and
``serve`` on server ranks (from ``dmlctl.init``). Both end up here:

* :func:`prepare_worker` — plans the shards over the job's servers, sends the layout
  and the first worker's parameters to every rank, and wraps the user's optimizer in
  a :class:`~dmlctl.ps.worker.PSOptimizer`;
* :func:`serve` — runs :func:`dmlctl.ps.serve.run_server`.

Importing this module is cheap (no torch): the control plane imports the strategy
modules for their ``Params``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from dmlctl.protocol import ROLE_SERVER, ROLE_WORKER

if TYPE_CHECKING:
    import torch

    from dmlctl.runtime.context import Context

ROLES: tuple[str, ...] = (ROLE_WORKER, ROLE_SERVER)


def first_lr(optimizer: torch.optim.Optimizer) -> float:
    """The ``lr`` of the optimizer's first param group (0.0 when it has none)."""
    lr = optimizer.param_groups[0].get("lr", 0.0) if optimizer.param_groups else 0.0
    return float(lr)


def delta_rule(scale: float | None, workers: int) -> dict[str, Any]:
    """The server rule of the delta-pushing strategies (asgd, ssp): add each pushed
    change times ``scale``, by default ``1/workers``."""
    return {"kind": "scaled_add", "alpha": scale if scale is not None else 1.0 / workers}


def prepare_worker(
    ctx: Context,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    rule: dict[str, Any],
    mode: str,
    staleness_bound: int | None = None,
    **options: Any,
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Bootstrap this worker and wrap ``optimizer`` (see the module docstring).
    ``options`` go to :class:`~dmlctl.ps.worker.PSOptimizer` (n_push, n_fetch,
    period, elastic_alpha). Collective with every rank (servers included)."""
    from dmlctl.ps.bootstrap import Layout
    from dmlctl.ps.shards import plan_shards
    from dmlctl.ps.worker import PSOptimizer, start_worker

    members = ctx.membership
    if members is None:
        raise RuntimeError(
            f"strategy {ctx.strategy!r} needs parameter servers: set 'parameter_servers' "
            "in the job (and launch it with dmlctl)"
        )
    params = [p for p in model.parameters() if p.requires_grad]
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        found = ", ".join(sorted(map(str, dtypes)))
        raise RuntimeError(f"parameter servers need one parameter dtype, got {found}")
    layout = Layout(
        shapes=[tuple(p.shape) for p in params],
        dtype=str(params[0].dtype).removeprefix("torch."),
        plan=plan_shards([p.numel() for p in params], len(members.servers)),
        workers=list(members.workers),
        servers=list(members.servers),
        rule=rule,
        staleness_bound=staleness_bound,
    )
    layout = start_worker(ctx, params, layout)
    opt = PSOptimizer(optimizer, params, ctx=ctx, layout=layout, mode=mode, **options)
    return model, opt


def serve(ctx: Context, params: BaseModel) -> None:
    """A server rank's whole life (``params`` are in the layout the workers send)."""
    del params
    from dmlctl.ps.serve import run_server

    run_server(ctx)
