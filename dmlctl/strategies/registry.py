"""Strategies registered by name, imported lazily.

The control plane uses this registry to validate a job's ``strategy`` block before
anything starts (the parameter model lives in the strategy's module, which must not
import torch at module level). The runtime uses it to find the strategy's
``prepare`` function on the hosts. Adding a strategy = one module + one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel


class StrategyModule(Protocol):
    """What a strategy module provides (module-level names).

    A module may also set ``NEEDS_RUNTIME = False`` when a script that never calls
    ``ctx.prepare`` still runs it faithfully (``none``, and ``ssgd`` without parameters,
    whose DDP a plain torchrun script builds itself), or define
    ``needs_runtime(params) -> bool`` to decide by its parameters; every other strategy
    makes such a script fail before its first optimizer step (see :func:`needs_runtime`).
    """

    Params: type[BaseModel]
    ROLES: tuple[str, ...]

    def prepare(self, ctx: Any, model: Any, optimizer: Any, params: BaseModel) -> tuple[Any, Any]:
        """Wrap ``model`` and ``optimizer`` for this strategy; return the wrapped pair."""
        ...


@dataclass(frozen=True)
class StrategyEntry:
    name: str
    module: str
    summary: str


_REGISTRY: dict[str, StrategyEntry] = {
    e.name: e
    for e in (
        StrategyEntry(
            "none",
            "dmlctl.strategies.none",
            "plain torchrun semantics: dmlctl applies no strategy (the script does its own)",
        ),
        StrategyEntry(
            "ssgd",
            "dmlctl.strategies.ssgd",
            "synchronous SGD: gradients all-reduced every step (DDP), optional compression",
        ),
        StrategyEntry(
            "local-sgd",
            "dmlctl.strategies.local_sgd",
            "model averaging: H local steps, then parameters averaged (post-local SGD)",
        ),
        StrategyEntry(
            "bmuf",
            "dmlctl.strategies.bmuf",
            "block-wise model update filtering: block momentum on the averaged update",
        ),
        StrategyEntry(
            "easgd",
            "dmlctl.strategies.easgd",
            "elastic averaging SGD: workers pulled towards a shared center variable",
        ),
        StrategyEntry(
            "admm",
            "dmlctl.strategies.admm",
            "consensus ADMM: local proximal steps, averaged consensus, dual updates",
        ),
        StrategyEntry(
            "dpsgd",
            "dmlctl.strategies.dpsgd",
            "decentralized SGD: gossip averaging with neighbours on a topology",
        ),
        StrategyEntry(
            "asgd",
            "dmlctl.strategies.asgd",
            "asynchronous SGD (Downpour) on parameter servers: push every n_push, "
            "pull every n_fetch steps",
        ),
        StrategyEntry(
            "ssp",
            "dmlctl.strategies.ssp",
            "stale synchronous parallel on parameter servers: at most s clocks ahead "
            "of the slowest worker",
        ),
        StrategyEntry(
            "adadelay",
            "dmlctl.strategies.adadelay",
            "asynchronous SGD whose server step size shrinks with each update's delay",
        ),
        StrategyEntry(
            "easgd-async",
            "dmlctl.strategies.easgd_async",
            "asynchronous elastic averaging: workers exchange with a center on the servers",
        ),
        StrategyEntry(
            "hogwild",
            "dmlctl.strategies.hogwild",
            "lock-free updates of parameters in shared memory by the workers of one host",
        ),
    )
}


class UnknownStrategy(KeyError):
    """Raised for a name that is not registered; ``str()`` lists the valid names."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(name)

    def __str__(self) -> str:
        return f"unknown strategy {self.name!r}; valid: {', '.join(names())}"


_P = TypeVar("_P", bound=BaseModel)


def params_as(cls: type[_P], params: BaseModel) -> _P:
    """``params`` as an instance of the strategy's ``Params`` model (validated anew
    when it is another model, e.g. from a different import of the module)."""
    return params if isinstance(params, cls) else cls.model_validate(params.model_dump())


def names() -> list[str]:
    """Registered strategy names, sorted."""
    return sorted(_REGISTRY)


def entry(name: str) -> StrategyEntry:
    """The registry entry for ``name`` or :class:`UnknownStrategy`."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownStrategy(name) from None


def needs_runtime(name: str, params: BaseModel | None = None) -> bool:
    """Whether strategy ``name`` with ``params`` only works through ``ctx.prepare``
    (see :class:`StrategyModule`)."""
    module = load(name)
    decide = getattr(module, "needs_runtime", None)
    if callable(decide) and params is not None:
        return bool(decide(params))
    return bool(getattr(module, "NEEDS_RUNTIME", True))


def load(name: str) -> StrategyModule:
    """Import and return the strategy module for ``name`` (cheap: no torch at import)."""
    module: StrategyModule = importlib.import_module(entry(name).module)
    return module
