"""Strategies registered by name, imported lazily.

Each strategy is a package ``dmlctl/strategies/<name>/`` with two modules:

* ``params`` — torch-free: its ``Params`` model, its ``ROLES`` and the checks the
  control plane runs before anything starts (see :class:`ParamsModule`);
  :func:`load` returns it. The control plane imports nothing else of a strategy.
* ``strategy`` — torch: ``prepare`` (and ``serve`` for parameter-server strategies),
  see :class:`RuntimeModule`; :func:`load_runtime` returns it, on the hosts only.

This module is torch-free: it is where the control plane and the data plane meet.
Adding a strategy = one package + one entry here.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from dmlctl.strategies.params import Capabilities


class ParamsModule(Protocol):
    """What a strategy's ``params`` module provides (module-level names): its
    parameter model, its :class:`~dmlctl.strategies.params.Capabilities` (roles,
    dashboard columns, whether it needs the runtime, the parallelism it combines with,
    its world and host checks) and its measured quality."""

    Params: type[BaseModel]
    CAPABILITIES: Capabilities
    QUALITY: str
    """What its defaults reach against one process on the bench's two tables (digits,
    the language model), measured, and the setting that closes a gap: printed by
    ``dmlctl strategies NAME`` (docs/strategies.md has the tables)."""


class RuntimeModule(Protocol):
    """What a strategy's torch module provides on the hosts (module-level names).

    Parameter-server strategies also define ``serve(ctx, params) -> None``: a server
    rank's whole life."""

    def prepare(self, ctx: Any, model: Any, optimizer: Any, params: BaseModel) -> tuple[Any, Any]:
        """Wrap ``model`` and ``optimizer`` for this strategy; return the wrapped pair."""
        ...


@dataclass(frozen=True)
class StrategyEntry:
    """One registered strategy: its name in job files, its package, one line about it."""

    name: str
    package: str
    summary: str

    @property
    def params_module(self) -> str:
        """The torch-free module the control plane imports (:class:`ParamsModule`)."""
        return f"{self.package}.params"

    @property
    def module(self) -> str:
        """The module the hosts run (:class:`RuntimeModule`); it imports the params
        module, so its imports are everything a host needs for this strategy."""
        return f"{self.package}.strategy"


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
            "ensemble",
            "dmlctl.strategies.ensemble",
            "model ensemble: H local steps, then each worker distills the workers' "
            "averaged outputs into its own model",
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
            "sync-ps",
            "dmlctl.strategies.sync_ps",
            "synchronous SGD on parameter servers; backup workers: a step needs K − b "
            "gradients, late ones are dropped",
        ),
        StrategyEntry(
            "aadmm",
            "dmlctl.strategies.aadmm",
            "asynchronous consensus ADMM: z on the servers, partial barrier K₀, bounded delay τ",
        ),
        StrategyEntry(
            "cyclades",
            "dmlctl.strategies.cyclades",
            "conflict-free asynchronous SGD on shared memory (one host): sampled updates "
            "split into conflict-free components per worker",
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
        return (
            f"unknown strategy {self.name!r}{did_you_mean(self.name)}; valid: {', '.join(names())}"
        )


def did_you_mean(name: str) -> str:
    """`` (did you mean 'local-sgd'?)`` for a name close to a registered one (case,
    ``_`` for ``-``, a typo), else ``""``."""
    normal = name.strip().lower().replace("_", "-")
    known = names()
    close = [normal] if normal in known else difflib.get_close_matches(normal, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


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


def capabilities(name: str) -> Capabilities:
    """What strategy ``name`` is and can do (its params module's ``CAPABILITIES``)."""
    return load(name).CAPABILITIES


def needs_runtime(name: str, params: BaseModel | None = None) -> bool:
    """Whether strategy ``name`` with ``params`` only works through ``ctx.prepare``
    (:meth:`~dmlctl.strategies.params.Capabilities.runtime_needed`)."""
    return capabilities(name).runtime_needed(params)


def load(name: str) -> ParamsModule:
    """Import and return the params module of strategy ``name`` (cheap: no torch)."""
    module: ParamsModule = importlib.import_module(entry(name).params_module)
    return module


def columns(name: str) -> tuple[str, ...]:
    """The dashboard columns strategy ``name``'s ranks add besides comm/step and comm %
    (metric keys; its params module's ``COLUMNS``, none when it sets none)."""
    return capabilities(name).columns


def uses_gpus(name: str) -> bool:
    """Whether strategy ``name``'s workers take a GPU where the host has one (every
    strategy but those that share parameters through host memory)."""
    return not capabilities(name).host_memory


def load_runtime(name: str) -> RuntimeModule:
    """Import and return the torch module of strategy ``name`` (hosts only)."""
    module: RuntimeModule = importlib.import_module(entry(name).module)
    return module
