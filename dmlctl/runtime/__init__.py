"""Runtime API imported by training scripts on the hosts.

``init()`` returns the run's :class:`~dmlctl.runtime.context.Context` (rank, world,
role, device, strategy; ``prepare``, ``shard``, ``log``, ``barrier``,
``all_reduce_mean``), ``current()`` returns it again later.

Importing this package is cheap and never imports torch: the names below load
:mod:`dmlctl.runtime.context` on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dmlctl.runtime.context import Context


def init(*, backend: str | None = None, seed: int | None = 0) -> Context:
    """Join the run and return its context (see :func:`dmlctl.runtime.session.init`)."""
    from dmlctl.runtime.session import init as _init

    return _init(backend=backend, seed=seed)


def current() -> Context:
    """The context returned by :func:`init` (``RuntimeError`` before it)."""
    from dmlctl.runtime.session import current as _current

    return _current()


def __getattr__(name: str) -> Any:
    if name == "Context":
        from dmlctl.runtime.context import Context

        return Context
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Context", "current", "init"]
