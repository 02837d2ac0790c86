"""What a rank learns from its environment (pure: no torch, no I/O besides imports).

torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``; the
dmlctl plan adds ``DMLCTL_ROLE``, ``DMLCTL_STRATEGY``, ``DMLCTL_STRATEGY_PARAMS`` and
``DMLCTL_RANK_DIR`` and ``DMLCTL_BACKEND`` (see :mod:`dmlctl.protocol`); with parameter servers,
``DMLCTL_LOCAL_ROLES`` names each local rank's role. Every variable is optional: a plain
``python train.py`` is rank 0 of 1, role ``worker``, strategy ``ssgd`` with defaults.

The strategy's parameter model and roles come from the caller (the session passes
:func:`dmlctl.strategies.registry.load`): the runtime never imports the strategies.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ValidationError

from dmlctl import gpus, mesh
from dmlctl.protocol import (
    DEFAULT_STRATEGY,
    ENV_BACKEND,
    ENV_PARALLELISM,
    ENV_PARALLELIZE,
    ENV_RANK_DIR,
    ENV_STRATEGY,
    ENV_STRATEGY_PARAMS,
    ROLE_WORKER,
    local_role,
)

if TYPE_CHECKING:
    from dmlctl.strategies.params import Capabilities

DEFAULT_ROLE = ROLE_WORKER


class StrategyParams(Protocol):
    """What a rank's environment is checked against: the strategy's parameter model
    and the roles it has (a strategy's params module)."""

    Params: type[BaseModel]
    CAPABILITIES: Capabilities


Describe = Callable[[str], StrategyParams]
"""Strategy name → :class:`StrategyParams`; raises for an unknown name."""


@dataclass(frozen=True)
class RunEnv:
    """The validated view of one rank's environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    role: str
    strategy: str
    params: BaseModel
    rank_dir: str | None
    capabilities: Capabilities  # the strategy's
    layout: mesh.MeshLayout | None = None  # the job's parallelism block, resolved
    parallelize: str | None = None  # the job's ``parallelize: FILE:FUNCTION``
    backend: str = gpus.AUTO  # the job's ``backend:`` (:data:`dmlctl.gpus.BACKENDS`)


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


_VALIDATED: dict[tuple[str, str, Describe], tuple[StrategyParams, BaseModel]] = {}


def chosen_strategy(
    environ: Mapping[str, str], describe: Describe
) -> tuple[str, StrategyParams, BaseModel]:
    """The strategy ``environ`` names (:data:`ENV_STRATEGY`, ``ssgd`` without it), its
    params module and its validated parameters (:data:`ENV_STRATEGY_PARAMS`): validated
    once per process, the same instance to every caller (the entry's guards, then
    ``dmlctl.init()``). Raises ``ValueError`` naming the variable for invalid
    parameters, and whatever ``describe`` raises for an unknown name."""
    name = environ.get(ENV_STRATEGY) or DEFAULT_STRATEGY
    raw = environ.get(ENV_STRATEGY_PARAMS) or "{}"
    key = (name, raw, describe)
    if key not in _VALIDATED:
        module = describe(name)
        try:
            _VALIDATED[key] = module, module.Params.model_validate(json.loads(raw))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise ValueError(
                f"{ENV_STRATEGY_PARAMS} is invalid for strategy {name!r}: {exc}"
            ) from exc
    module, params = _VALIDATED[key]
    return name, module, params


def read_env(environ: Mapping[str, str], describe: Describe) -> RunEnv:
    """Parse and check ``environ``, with ``describe`` giving the named strategy's
    parameter model and roles.

    Raises ``ValueError`` (naming the variable) for a non-integer rank variable, a
    rank outside the world, invalid strategy parameters or a role the strategy does
    not have, and whatever ``describe`` raises for an unknown strategy
    (:class:`~dmlctl.strategies.registry.UnknownStrategy`, listing the valid names,
    from the registry).
    """
    rank = _int(environ, "RANK", 0)
    world_size = _int(environ, "WORLD_SIZE", 1)
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world_size}")
    strategy, module, params = chosen_strategy(environ, describe)
    local_rank = _int(environ, "LOCAL_RANK", rank)
    role = local_role(environ, local_rank, DEFAULT_ROLE)
    roles = module.CAPABILITIES.roles
    if role not in roles:
        raise ValueError(f"role {role!r} is not one of strategy {strategy!r}'s: {roles}")
    return RunEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=_int(environ, "LOCAL_WORLD_SIZE", world_size),
        role=role,
        strategy=strategy,
        params=params,
        rank_dir=environ.get(ENV_RANK_DIR) or None,
        layout=_layout(environ),
        parallelize=environ.get(ENV_PARALLELIZE) or None,
        backend=_backend(environ),
        capabilities=module.CAPABILITIES,
    )


def _backend(environ: Mapping[str, str]) -> str:
    """``DMLCTL_BACKEND``, ``auto`` without it; ValueError naming it when unknown."""
    raw = environ.get(ENV_BACKEND) or gpus.AUTO
    if raw not in gpus.BACKENDS:
        raise ValueError(f"{ENV_BACKEND}={raw!r} is not one of: {', '.join(gpus.BACKENDS)}")
    return raw


def _layout(environ: Mapping[str, str]) -> mesh.MeshLayout | None:
    """``DMLCTL_PARALLELISM``, or None without it; ValueError naming it when invalid."""
    raw = environ.get(ENV_PARALLELISM)
    if not raw:
        return None
    try:
        return mesh.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV_PARALLELISM}: {exc}") from None
