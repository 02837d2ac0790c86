"""What a strategy says about the world it would run in (pure): the checks of the
first plan and of every re-plan, on the strategy parameters the spec validated."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from dmlctl.gpus import needs_a_gpu, too_few_gpus
from dmlctl.plan.placement import Placed
from dmlctl.strategies import registry


def world_problem(strategy: str, params: BaseModel, workers: int) -> str | None:
    """Why ``strategy`` with ``params`` cannot run on ``workers`` workers (EASGD's
    α ≤ 1/p: its module's ``check_world(params, world_size)``), or None."""
    check = registry.capabilities(strategy).check_world
    message = check(params, workers) if check is not None else None
    return f"strategy {strategy!r} with {workers} workers: {message}" if message else None


def hosts_problem(strategy: str, params: BaseModel, n_hosts: int) -> str | None:
    """Why ``strategy`` cannot run on ``n_hosts`` hosts (hogwild runs on one: its
    module's ``check_hosts(params, n_hosts)``), or None."""
    check = registry.capabilities(strategy).check_hosts
    message = check(params, n_hosts) if check is not None else None
    return f"strategy {strategy!r}: {message}" if message else None


def gpus_problem(
    strategy: str, backend: str, placed: Sequence[Placed], gpus: Mapping[str, int]
) -> str | None:
    """Why a host cannot give each of its workers a GPU of its own (``gpus``: the
    GPUs of the hosts whose count is known), or None. Strategies that train on the
    CPU (:func:`~dmlctl.strategies.registry.uses_gpus`) never need one; an NCCL
    backend needs one on every host that runs workers (:func:`~dmlctl.gpus.needs_a_gpu`)."""
    for p in placed:
        why = needs_a_gpu(p.workers, gpus[p.host], backend) if p.host in gpus else None
        if why is not None:
            return f"host {p.host!r}: {why}"
    if not registry.uses_gpus(strategy):
        return None
    for p in placed:
        why = too_few_gpus(p.workers, gpus.get(p.host, 0), backend)
        if why is not None:
            return f"host {p.host!r}: {why}"
    return None
