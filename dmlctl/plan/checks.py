"""What a strategy says about the world it would run in (pure): the checks of the
first plan and of every re-plan, on the strategy parameters the spec validated."""

from __future__ import annotations

from pydantic import BaseModel

from dmlctl.strategies import registry


def world_problem(strategy: str, params: BaseModel, workers: int) -> str | None:
    """Why ``strategy`` with ``params`` cannot run on ``workers`` workers (EASGD's
    α ≤ 1/p: its module's ``check_world(params, world_size)``), or None."""
    check = getattr(registry.load(strategy), "check_world", None)
    message = check(params, workers) if check is not None else None
    return f"strategy {strategy!r} with {workers} workers: {message}" if message else None


def hosts_problem(strategy: str, params: BaseModel, n_hosts: int) -> str | None:
    """Why ``strategy`` cannot run on ``n_hosts`` hosts (hogwild runs on one: its
    module's ``check_hosts(params, n_hosts)``), or None."""
    check = getattr(registry.load(strategy), "check_hosts", None)
    message = check(params, n_hosts) if check is not None else None
    return f"strategy {strategy!r}: {message}" if message else None
